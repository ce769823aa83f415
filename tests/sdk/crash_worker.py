"""A process that dies inside its executor, for test_crash.py (the test sends SIGKILL).

usage: python crash_worker.py POLICY_FILE STORE_URL MARKER_FILE
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path

import ctrlrun
from ctrlrun import Control, Policy
from ctrlrun.store import open_store


def main() -> None:
    policy, url, marker = sys.argv[1:4]
    control = Control(Policy.from_file(policy), open_store(url))

    @ctrlrun.protect("refund", lease=timedelta(seconds=1), control=control)
    def refund(payment_id: str, amount: int) -> None:
        Path(marker).write_text(ctrlrun.idempotency_token())  # the request is on the wire...
        time.sleep(60)  # ...and the process is killed before the reply arrives

    with ctrlrun.context(agent="crasher"):
        refund(payment_id="p1", amount=100)


if __name__ == "__main__":
    main()
