"""Pods of the fake cluster and what connects to them: ``exec``, ``attach``, ``portforward``.

A connect request is answered ``101 Switching Protocols`` when it asks to upgrade: to a
WebSocket (kubectl 1.30+, the Python client's ``stream``) speaking the channel protocol, where
the fake writes what the command "printed" on channel 1 and a ``Success`` Status on channel 3;
or to ``SPDY/3.1``, where the fake echoes the bytes it reads (no SPDY framing: enough to prove
a relay carries the stream both ways). Every accepted connection is kept as a
:class:`Session`, so a test can tell that nothing ran.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from ..messages import Request, Response
from .errors import ApiError, not_found, parse_json
from .objects import Obj, timestamp
from .routes import go_query

PODS = ("", "pods")
_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_CHANNELS = ("v5.channel.k8s.io", "v4.channel.k8s.io", "channel.k8s.io")
_PORTFORWARD = ("v4.portforward.k8s.io", "portforward.k8s.io")
_SESSION_SECONDS = 30.0  # an upgraded connection the peer leaves open is closed after this
_SUCCESS = {"metadata": {}, "status": "Success"}
_SMP = "application/strategic-merge-patch+json"
_MERGE = "application/merge-patch+json"


@dataclass(frozen=True)
class Session:
    """One accepted exec, attach or portforward connection."""

    kind: str  # exec | attach | portforward | ephemeral (a container kubectl debug adds)
    namespace: str
    pod: str
    container: str
    command: tuple[str, ...]
    protocol: str  # the negotiated subprotocol (WebSocket) or the Upgrade token (SPDY)


class Pods:
    """The pods of one fake cluster and the sessions opened to them (the caller holds the lock)."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], Obj] = {}
        self.sessions: list[Session] = []

    def add(
        self, namespace: str, name: str, containers: tuple[str, ...], rv: int, at: float
    ) -> Obj:
        self.pods[(namespace, name)] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "resourceVersion": str(rv),
                "creationTimestamp": timestamp(at),
            },
            "spec": {"containers": [{"name": c, "image": "busybox:1.36"} for c in containers]},
            "status": {"phase": "Running"},
        }
        return self.pods[(namespace, name)]

    def get(self, namespace: str, name: str) -> Obj:
        found = self.pods.get((namespace, name))
        if found is None:
            raise not_found(PODS, name)
        return found

    def connect(self, kind: str, namespace: str, name: str, request: Request) -> Response:
        """Accept an exec, attach or portforward, or refuse it as the apiserver would."""
        pod = self.get(namespace, name)
        # PodExecOptions and PodAttachOptions come from ``req.URL.Query()`` (the apiserver's
        # ParameterCodec): Go's net/url drops a pair with a bad escape or a ';' and reads on.
        query = go_query(request.target)
        container = next(iter(query.get("container", [])), "")
        if kind != "portforward":
            container = _container(pod, name, container)
        command = tuple(query.get("command", []))
        if kind == "exec" and not command:
            raise ApiError(400, "you must specify at least 1 command")
        upgrade = request.header("upgrade").lower()
        if upgrade == "websocket":
            offered = [p.strip() for p in request.header("sec-websocket-protocol").split(",")]
            chosen = _choose(offered, _PORTFORWARD if kind == "portforward" else _CHANNELS)
            session = Session(kind, namespace, name, container, command, chosen)
            self.sessions.append(session)
            return _websocket(request, session)
        if upgrade.startswith("spdy/"):
            self.sessions.append(Session(kind, namespace, name, container, command, upgrade))
            headers = {"Connection": "Upgrade", "Upgrade": request.header("upgrade")}
            version = request.header("x-stream-protocol-version").split(",")[0].strip()
            if version:
                headers["X-Stream-Protocol-Version"] = version
            return Response(101, headers=headers, upgrade=_echo)
        raise ApiError(400, "Upgrade request required")

    def add_ephemeral(self, namespace: str, name: str, request: Request, dry_run: bool) -> Obj:
        """``PATCH`` (strategic or merge) or ``PUT`` of ``pods/{pod}/ephemeralcontainers``, as
        ``kubectl debug`` sends it: each container new to ``spec.ephemeralContainers`` is
        started by the kubelet at once with its ``command`` and ``args`` (Kubernetes docs,
        "Debug Running Pods", ephemeral containers; kubectl's ``pkg/cmd/debug``). Kept as a
        :class:`Session` of kind ``ephemeral``."""
        pod = self.get(namespace, name)
        kind = request.header("content-type").split(";", 1)[0].strip()
        if request.method == "PATCH" and kind not in (_SMP, _MERGE):
            raise ApiError(415, f"the fake does not model a {kind or 'untyped'} patch here")
        body = parse_json(request.body)
        spec = body.get("spec") if isinstance(body, dict) else None
        given = spec.get("ephemeralContainers") if isinstance(spec, dict) else None
        if not isinstance(given, list) or not all(isinstance(c, dict) for c in given):
            raise ApiError(422, "Pod is invalid: spec.ephemeralContainers: Required value")
        known = pod["spec"].setdefault("ephemeralContainers", [])
        names = {c.get("name") for c in known}
        new = [c for c in given if c.get("name") not in names]
        if dry_run:
            return {**pod, "spec": {**pod["spec"], "ephemeralContainers": [*known, *new]}}
        for container in new:
            known.append(container)
            run = [*container.get("command", []), *container.get("args", [])]
            self.sessions.append(
                Session("ephemeral", namespace, name, str(container.get("name")), tuple(run), "")
            )
        return pod


def _container(pod: Obj, name: str, container: str) -> str:
    """The container an exec or attach reaches, as the apiserver's ``streamLocation`` picks
    it (``pkg/registry/core/pod/strategy.go``): the one named, which must be the pod's, or
    the only one; a pod of several needs a name."""
    names = [str(c["name"]) for c in pod["spec"]["containers"]]
    if container:
        if container not in names:
            raise ApiError(400, f"container {container} is not valid for pod {name}")
        return container
    if len(names) != 1:
        raise ApiError(
            400,
            f"a container name must be specified for pod {name}, choose one of: "
            f"[{' '.join(names)}]",
        )
    return names[0]


def _choose(offered: list[str], preferred: tuple[str, ...]) -> str:
    for name in preferred:
        if name in offered:
            return name
    return next((p for p in offered if p), "")


def _websocket(request: Request, session: Session) -> Response:
    key = request.header("sec-websocket-key").encode()
    accept = base64.b64encode(hashlib.sha1(key + _WS_GUID).digest()).decode()
    headers = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Accept": accept}
    if session.protocol:
        headers["Sec-WebSocket-Protocol"] = session.protocol

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, early: bytes) -> None:
        await _channels(reader, writer, early, session)

    return Response(101, headers=headers, upgrade=run)


async def _channels(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, early: bytes, session: Session
) -> None:
    """The channel protocol: output on 1 and the Status on 3 (exec, attach); echo (portforward)."""
    from wsproto.connection import Connection, ConnectionType
    from wsproto.events import BytesMessage, CloseConnection, Message

    ws = Connection(ConnectionType.SERVER)
    if session.kind != "portforward":
        printed = f"ran {' '.join(session.command) or session.kind} in {session.container}\n"
        writer.write(ws.send(BytesMessage(b"\x01" + printed.encode())))
        writer.write(ws.send(BytesMessage(b"\x03" + json.dumps(_SUCCESS).encode())))
        writer.write(ws.send(CloseConnection(1000)))
    data = early
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(_SESSION_SECONDS):
            while True:
                if data:
                    ws.receive_data(data)
                for event in ws.events():
                    if isinstance(event, CloseConnection):
                        if session.kind == "portforward":
                            writer.write(ws.send(event.response()))
                        await writer.drain()
                        return
                    if isinstance(event, Message) and session.kind == "portforward":
                        writer.write(ws.send(BytesMessage(_as_bytes(event.data))))
                await writer.drain()
                data = await reader.read(64 * 1024)
                if not data:
                    return


def _as_bytes(data: Any) -> bytes:
    return bytes(data) if isinstance(data, bytes | bytearray) else str(data).encode()


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, early: bytes) -> None:
    """An upgraded stream that sends back what it reads, until the peer stops."""
    if early:
        writer.write(early)
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(_SESSION_SECONDS):
            while data := await reader.read(64 * 1024):
                writer.write(data)
                await writer.drain()
