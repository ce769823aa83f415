"""The values route matching takes and returns, and the strict parsing every profile shares."""

from __future__ import annotations

import json
import re
from collections.abc import Container, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, TypeAlias
from urllib.parse import unquote_plus, unquote_to_bytes

from ctrlrun.templates import TemplateSyntaxError, parse_template

MAX_BODY = 1024 * 1024
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# The methods a route may name, in the order messages list them (config_parse uses it too).
WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")
# Headers (and a query parameter) that frameworks read as "use this method instead": a GET
# carrying one may be a DELETE to the remote, so it is never a read.
OVERRIDE_HEADERS = (
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
    # IIS-era frameworks (Zend, Laminas, old Symfony) route by these instead of the path.
    "x-original-url",
    "x-rewrite-url",
)


def _spellings(name: str) -> list[str]:
    """``name`` with each '-' as '-' or '_': Rack and CGI servers read both as one header."""
    out = [""]
    for char in name:
        out = [o + c for o in out for c in ("-_" if char == "-" else char)]
    return out


# Every spelling of the override headers, for the lookups that cannot normalise a name.
OVERRIDE_SPELLINGS = frozenset(v for n in OVERRIDE_HEADERS for v in _spellings(n))
OVERRIDE_PARAMETER = "_method"
# Headers that say how to read a write's body: sent twice, ctrlrun could read another body.
BODY_HEADERS = frozenset({"content-type", "content-encoding"})
# The same rule in bytes, for the addon's check of a raw request (reads are its hot path).
READ_METHOD_BYTES = frozenset(m.encode() for m in READ_METHODS)
WRITE_HEADER_BYTES = frozenset(n.encode() for n in ("upgrade", *OVERRIDE_SPELLINGS))

# Unicode category Cc is exactly C0, DEL and C1: what can split a header or a log line.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


@dataclass(frozen=True)
class Request:
    """What the addon gathers from a flow: ``path`` as sent (still percent-encoded), no query."""

    method: str
    path: str
    query: Mapping[str, list[str]] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names
    body: bytes = b""  # as it will be forwarded (still content-encoded, if it is)
    repeated: frozenset[str] = frozenset()  # lower-case names of headers sent more than once
    folded: frozenset[str] = frozenset()  # lower-case names of headers with a line break
    fragment: bool = False  # the target as sent holds a '#'
    raw_query: str = ""  # the target after its first '?', as sent ('#' and all)
    trailers: bool = False  # the body ended with trailer fields (HTTP/2)


@dataclass(frozen=True)
class PassThrough:
    """Not consequential: a read, a watch, a server-side dry run."""

    reason: str


@dataclass(frozen=True)
class Mapped:
    """A write that matches a route: the action and its plain-JSON arguments."""

    action: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Unmapped:
    """A write that matches no route."""

    reason: str


@dataclass(frozen=True)
class Invalid:
    """A write ctrlrun cannot read with certainty, so it is refused."""

    reason: str


@dataclass(frozen=True)
class KubeWrite:
    """A PATCH or PUT of an apps/v1 workload (or its ``/scale``): its action depends on what
    the apiserver would store, so ``kube_result`` asks it (``dryRun=All``) before deciding."""

    kind: str  # the resource: deployments, statefulsets or replicasets
    namespace: str
    name: str
    scale: bool  # the /scale subresource
    media: str  # the patch type ("merge", "strategic", "json", "apply") or "put"
    document: Any  # the body, parsed; forwarded re-encoded with a resourceVersion precondition
    arguments: dict[str, Any]  # cluster, namespace, the kind's own name and workload


RouteResult: TypeAlias = PassThrough | Mapped | Unmapped | Invalid | KubeWrite


class BadInput(Exception):
    """Raised inside the route modules; ``map_request`` turns it into ``Invalid``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def hidden_write(method: str, headers: Container[str], query: Container[str]) -> str | None:
    """Why a request can change something although nothing else says so; None for a read.

    A read is exactly GET, HEAD or OPTIONS (as spelt: servers differ on "get"), with no
    ``Upgrade`` (a websocket to ``pods/exec`` runs a command) and no method override.
    ``headers`` holds lower-case names (a dict as ``Request`` has, or mitmproxy's Headers).
    """
    if method not in READ_METHODS:
        return f"{shown(method)} is not a read method"
    if "upgrade" in headers:
        return f"{method} with Upgrade opens a connection that can change anything"
    override = overridden(headers, query)
    return None if override is None else f"{method} with {override}"


def unreadable(request: Request) -> str | None:
    """Why a request must not reach an upstream whatever it is, or None.

    A header folded over two lines (obs-fold) reaches the remote as sent, and a server that
    starts a new header at the second line would read one ctrlrun never saw. A read with a
    body: a server that does not read the body of a GET takes it for a request of its own
    on the same connection, a write nobody decided. A '#' in the target: clients strip a
    fragment before sending, and servers differ on one that arrives (Puma and Express end
    the query there, Go's net/http reads on), as does the query ctrlrun is given.
    """
    if request.fragment:
        return (
            "the request target holds a '#', which servers read differently (a fragment, "
            "or part of the path or query); send the request without it, or encode it as %23"
        )
    if request.folded:
        name = sorted(request.folded)[0]
        return f"the header {shown(name, 60)} is folded over two lines; send it on one"
    if request.body and request.method in READ_METHODS:
        return (
            f"a {request.method} with a body is refused: a server that does not read it "
            "would take it for a request of its own; send the body with a write method"
        )
    return None


def overridden(headers: Container[str], query: Container[str]) -> str | None:
    """The method-override header (or query parameter) the request carries, if any."""
    for name in OVERRIDE_SPELLINGS:
        if name in headers:
            return name
    return f"?{OVERRIDE_PARAMETER}=" if OVERRIDE_PARAMETER in query else None


def body_override(request: Request) -> str | None:
    """A ``_method`` field in a write's body, if any: Rails (Rack::MethodOverride), Laravel
    and Symfony read it from a POST's form (Laravel from a JSON object too) as the method to
    run, so a POST ctrlrun decides as POST could run as a DELETE. Read leniently, to find
    the field in any spelling a server would decode."""
    kind = media_type(request.headers)
    body = request.body
    if not body or len(body) > MAX_BODY:
        return None  # an oversized body is refused where a route reads it
    if kind == "application/x-www-form-urlencoded":
        for part in body.split(b"&"):
            key = unquote_plus(part.split(b"=", 1)[0].decode("latin-1"), errors="replace")
            if key.strip().split("[", 1)[0] == OVERRIDE_PARAMETER:
                return f"a {OVERRIDE_PARAMETER} field in its form body"
    elif kind.startswith("multipart/"):
        if re.search(rb"""name\s*=\s*["']?_method\b""", body, re.IGNORECASE):
            return f"a {OVERRIDE_PARAMETER} part in its multipart body"
    elif body.lstrip()[:1] == b"{":
        try:
            value = json.loads(body)
        except (ValueError, RecursionError):
            return None  # a route that reads JSON refuses it; nothing else reads it as JSON
        if isinstance(value, dict) and any(
            isinstance(k, str) and k.casefold() == OVERRIDE_PARAMETER for k in value
        ):
            return f"a {OVERRIDE_PARAMETER} member in its JSON body"
    return None


def shown(text: str, limit: int = 120) -> str:
    """``text`` quoted and cut short, safe to put in a reason."""
    return repr(text if len(text) <= limit else text[:limit] + "…")


def media_type(headers: Mapping[str, str]) -> str:
    """The Content-Type without parameters, lower case ('' when absent)."""
    return headers.get("content-type", "").split(";", 1)[0].strip().lower()


def check_body(request: Request) -> None:
    """Refuse a body ctrlrun will not parse on the protected path: too large, or encoded."""
    if len(request.body) > MAX_BODY:
        raise BadInput(f"the body is {len(request.body)} bytes; ctrlrun reads at most {MAX_BODY}")
    charset = body_charset(request.headers, request.body)
    if request.body and charset is not None:
        raise BadInput(f"cannot read a body in charset {shown(charset, 40)}; send UTF-8")
    for name in sorted(BODY_HEADERS & request.repeated):
        # Servers differ on which of two they read (Go's the first, others the last), and a
        # body can be one write as a form and another as JSON.
        raise BadInput(f"the header {name} is sent more than once")
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if request.body and encoding not in ("", "identity"):
        # The body is forwarded as sent, so it is read as sent: bytes that parse one way
        # here and decompress into another request upstream would slip past the route.
        raise BadInput(f"cannot read a body with Content-Encoding {shown(encoding)}")


def body_charset(headers: Mapping[str, str], body: bytes) -> str | None:
    """A charset the Content-Type names other than UTF-8 (or ASCII, for a body that is), else
    None: ctrlrun reads bodies as UTF-8, a server honouring ``charset=utf-7`` reads "+AF8-" as
    "_", and one honouring us-ascii reads "é" and "ü" both as U+FFFD (or "?")."""
    for param in headers.get("content-type", "").split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            value = value.strip().strip('"').lower()
            if value not in ("utf-8", "utf8", "us-ascii") or (
                value == "us-ascii" and not body.isascii()
            ):
                return value
    return None


def unquote_strict(text: str, *, plus: bool) -> str:
    """Percent-decode ``text`` (``+`` as space in forms); bad escapes or bad UTF-8 raise."""
    if _BAD_ESCAPE.search(text):
        raise BadInput(f"{shown(text)} has a malformed percent escape")
    if plus:
        text = text.replace("+", " ")
    try:
        return unquote_to_bytes(text).decode("utf-8")
    except UnicodeError as exc:  # encode (lone surrogates) or decode (bytes not UTF-8)
        raise BadInput(f"{shown(text)} is not valid UTF-8 once decoded") from exc


def path_segments(path: str) -> list[str]:
    """Decode a write's path into segments; refuse a path remotes could read differently.

    Servers disagree on ``%2F``, ``//``, ``.`` and ``..`` (Go's apiserver decodes ``%2F`` into
    a separator, others do not), and an agent could use that to make one resource look like
    another to ctrlrun. One trailing slash is ignored, so matching errs on the protected side.
    """
    if not path.startswith("/"):
        raise BadInput(f"the path {shown(path)} does not start with '/'")
    parts = path[1:].split("/")
    if parts[-1] == "":
        parts.pop()
    segments = []
    for part in parts:
        segment = unquote_strict(part, plus=False)
        if segment in ("", ".", "..") or any(c in segment for c in "/%?#"):  # %2573 is s, decoded
            raise BadInput(  # again by a proxy (nginx, IIS) in front of the remote
                f"the path {shown(path)} is ambiguous (empty, dot or encoded '/', '%', '?' or '#')"
            )
        if _CONTROL.search(segment):
            raise BadInput(f"the path {shown(path)} contains a control character")
        if "\\" in segment:
            # IIS, and frameworks on Windows, read a backslash as a '/'.
            raise BadInput(f"the path {shown(path)} has a backslash, which servers differ on")
        if ";" in segment:
            # Spring and Tomcat drop ';' parameters from a segment: "in_1;x" is "in_1" there.
            raise BadInput(f"the path {shown(path)} has a ';' parameter, which servers differ on")
        segments.append(segment)
    return segments


@lru_cache(maxsize=256)
def compile_path(template: str) -> tuple[tuple[bool, str], ...] | None:
    """A path template as (is_parameter, text) segments; None if it cannot match whole segments."""
    if not template.startswith("/"):
        return None
    parts = template[1:].split("/")
    if parts[-1] == "":
        parts.pop()
    compiled = []
    for part in parts:
        try:
            names = parse_template(part).names
        except TemplateSyntaxError:
            return None  # an empty segment or a stray brace: the policy loader refuses these
        if names and part != "{" + names[0] + "}":
            return None  # "{a}-{b}" or "v{n}": only whole-segment parameters are supported
        compiled.append((True, names[0]) if names else (False, part))
    return tuple(compiled)


def match_path(template: str, segments: list[str]) -> dict[str, str] | None:
    """The path parameters if ``segments`` match ``template``, else None."""
    compiled = compile_path(template)
    if compiled is None or len(compiled) != len(segments):
        return None
    params: dict[str, str] = {}
    for (is_param, text), segment in zip(compiled, segments, strict=True):
        if is_param:
            params[text] = segment
        elif text != segment:
            return None
    return params


def _refuse_float(text: str) -> Any:
    raise BadInput(f"the JSON body contains the non-integer number {shown(text)}")


def _refuse_constant(text: str) -> Any:
    raise BadInput(f"the JSON body contains {text}, which is not JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Parsers disagree on which duplicate wins; a differential is a way to smuggle a value.
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise BadInput(f"the JSON body repeats the key {shown(key)}")
        obj[key] = value
    return obj


def _no_folded_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Go's encoding/json and ASP.NET's web defaults match keys without regard to case, the
    # last one winning: {"amount": 1, "Amount": 900000} is 900000 there.
    seen: set[str] = set()
    for key, _ in pairs:
        if key.casefold() in seen:
            raise BadInput(f"the JSON body repeats the key {shown(key)} (case aside)")
        seen.add(key.casefold())
    return _no_duplicates(pairs)


def load_json(body: bytes, *, floats: bool, folded: bool = False) -> Any:
    """Parse a JSON body strictly: UTF-8, no duplicate keys, no NaN; floats only if allowed.

    ``folded``: also refuse two keys of one object that differ only in case."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput("the body is not valid UTF-8") from exc
    try:
        return json.loads(
            text,
            object_pairs_hook=_no_folded_duplicates if folded else _no_duplicates,
            parse_constant=_refuse_constant,
            parse_float=None if floats else _refuse_float,
        )
    except (ValueError, RecursionError) as exc:  # bad JSON, too deep, an int too long
        raise BadInput(f"the body is not valid JSON ({str(exc)[:80]})") from exc


def _walk(value: Any) -> Iterator[tuple[str, bool]]:
    """Every string inside ``value`` and whether it is a key, without recursion."""
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        item, is_key = stack.pop()
        if isinstance(item, str):
            yield item, is_key
        elif isinstance(item, dict):
            stack.extend((key, True) for key in item)
            stack.extend((child, False) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, False) for child in item)


def check_arguments(arguments: Mapping[str, Any]) -> None:
    """Refuse text that could split a header or a log line where an effect key can use it.

    Top-level strings and every key are checked for control characters: effect templates
    take top-level values only, so nested text (a message body with newlines) stays free.
    Lone surrogates are refused everywhere: they cannot be encoded for the action hash.
    """
    for key, value in arguments.items():
        if _CONTROL.search(key) or (isinstance(value, str) and _CONTROL.search(value)):
            raise BadInput(f"argument {shown(key)} contains a control character")
        for text, is_key in _walk(value):
            if _SURROGATE.search(text):
                raise BadInput(f"argument {shown(key)} contains an unpaired surrogate")
            if is_key and _CONTROL.search(text):
                raise BadInput(f"argument {shown(key)} has a key with a control character")
