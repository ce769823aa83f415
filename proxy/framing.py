"""What an HTTP/1.1 server would frame otherwise than ctrlrun read the request.

HTTP/2 carries the target and each header as a length-prefixed field, and mitmproxy relays a
request it received over HTTP/2 to an HTTP/1.1 server by writing them out as sent. A CR, LF
or space in ``:path`` ends the request line there: ``GET /x HTTP/1.1\\r\\n\\r\\nPOST /send``
reaches the server as a read and then a write nobody decided. A ``content-length`` that is
not the length of the body the stream carried tells the server to read that many bytes more,
the start of the next request on the connection, whose remainder it then runs as a request of
its own. HTTP/1.1 requests never hold either (mitmproxy's reader splits the target at
whitespace and frames the body by that header); both are refused wherever they come from.

Trailer fields after an HTTP/2 body have no HTTP/1.1 form without chunking: mitmproxy crashes
the stream once the head (and body) went out, and ctrlrun's own forwarder would send the
request without them, another request than the one decided. A request with trailers is
refused before anything is sent.
"""

from __future__ import annotations

import re

from .route_values import WRITE_HEADER_BYTES, Request, shown

UNSENDABLE = re.compile(r"[\x00-\x20\x7f]")  # ends or splits an HTTP/1.1 request line
UNSENDABLE_BYTES = re.compile(rb"[\x00-\x20\x7f]")
# Headers (lower case, as bytes) a read must not carry to pass unparsed: the guard reads them.
NO_READ_HEADERS = WRITE_HEADER_BYTES | {b"content-length"}


def unframed(request: Request) -> str | None:
    """Why ``request`` would reach an HTTP/1.1 server as other requests than it is, or None."""
    if UNSENDABLE.search(request.path) or UNSENDABLE.search(request.raw_query):
        return (
            "the request target holds a space or control character, which ends an HTTP/1.1 "
            "request line early; percent-encode it"
        )
    if request.trailers:
        return (
            "the request ends with trailer fields, which ctrlrun does not relay; "
            "send them as headers"
        )
    length = request.headers.get("content-length")
    if length is not None and length.strip() != str(len(request.body)):
        return (
            f"the Content-Length header says {shown(length, 40)} but the body has "
            f"{len(request.body)} bytes; a server would read the next request as the rest"
        )
    return None
