"""What a POST to the console carries: a urlencoded form of bounded size, read whole."""

from __future__ import annotations

import re
from email.message import Message
from io import BufferedIOBase
from urllib.parse import parse_qs

MAX_BODY = 64 * 1024  # bytes of a form
MAX_FIELDS = 20
CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # all but tab and line ends


def read(headers: Message, rfile: BufferedIOBase) -> tuple[dict[str, str] | None, bool]:
    """The form (None: no form, or not one the console reads) and whether its body was read:
    when it was not (no length, or one past ``MAX_BODY``), nothing else may follow on the
    connection, since its bytes would be taken for a request."""
    kind = headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
    try:
        length = int(headers.get("Content-Length", ""))
    except ValueError:
        length = -1
    if not 0 <= length <= MAX_BODY:
        return None, False
    raw = rfile.read(length).decode("utf-8", errors="replace")
    if kind != "application/x-www-form-urlencoded":
        return None, True
    try:
        fields = parse_qs(raw, keep_blank_values=True, max_num_fields=MAX_FIELDS)
    except ValueError:
        return None, True
    return {k: v[0] for k, v in fields.items()}, True
