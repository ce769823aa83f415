"""Log lines for long-running commands: plain text, or one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from . import tracing
from .action import iso, utc_now

FIELDS = ("action", "effect_key", "outcome", "reason", "receipt_id", "policy_hash", "agent")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, message, and a decision's fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": iso(utc_now()),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "ctrlrun", None)
        fields = fields if isinstance(fields, dict) else {}
        doc.update({k: fields[k] for k in FIELDS if fields.get(k) is not None})
        # Any line logged inside a protected request or call names its trace.
        trace_id = fields.get("trace_id") or tracing.trace_id()
        if trace_id:
            doc["trace_id"] = trace_id
        if record.exc_info and record.exc_info[0] is not None:
            doc["error"] = record.exc_info[0].__name__
        return json.dumps(doc)


def configure(fmt: str = "text", level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("mitmproxy", "httpx", "httpcore", "alembic", "hpack"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
