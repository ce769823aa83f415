"""Who holds a lease, so that another process on the same host can tell it is still running.

A lease is judged on the ledger's clock, on SQLite this host's wall clock. A step forward of
that clock (NTP, a resumed VM; on PostgreSQL, the database host's clock) of more than what is
left of a running call's lease made it look expired until its next renewal, and another
process that retried the key in that gap ambiguated it, heard ``not_executed`` from a remote
the running call had not reached yet, and ran the effect a second time. Within one process
``heartbeat.running_here`` already knew better; here every process on the host does:

- The holder writes who it is with the lease (``lease_holder``: boot id, time and pid
  namespaces, pid and the process's start time) and when the lease ends on this host's
  monotonic clock (``lease_steady_until``), which no step of the wall clock moves and which
  every process of one boot and time namespace reads alike.
- A contender on that host takes the lease as live while the holder process is alive (same
  pid *and* start time: a reused pid is another process) and its monotonic end is not past,
  whatever the wall clock says. A holder it cannot see (another pid namespace) counts as
  alive, still only until that monotonic end: a lease left behind by a call that ended
  without its outcome being written runs out in real time, as before.
- A holder that died, or one on another host, is judged on the ledger's clock alone.
- A lease whose holder cannot be checked (written by an older ctrlrun, which names no holder;
  one on another host; off Linux) was taken as expired the moment the ledger's clock passed
  its end, so a forward step of that clock let a contender steal a live lease of an older
  sidecar sharing the ledger. A process that once saw such a lease live notes on its
  monotonic clock how much of it was left (``saw_live``), and takes it as live until that
  much time has really passed (``seen_live``): a step after that sight no longer shortens it.
"""

from __future__ import annotations

import functools
import os
import threading
from collections import OrderedDict
from datetime import datetime, timedelta

from . import steady

_BOOT_ID = "/proc/sys/kernel/random/boot_id"
KEEP = 4096  # leases remembered at most, the newest
# (effect key, action id, attempt, lease end) -> its end on this host's monotonic clock
_seen: OrderedDict[tuple[str, str, int, datetime], float] = OrderedDict()
_seen_lock = threading.Lock()


@functools.cache
def _host() -> tuple[str, str, str] | None:
    """(boot id, time namespace, pid namespace) of this process; None off Linux."""
    try:
        with open(_BOOT_ID, encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        return None
    return boot, _namespace("time"), _namespace("pid")


def _namespace(kind: str) -> str:
    try:
        return os.readlink(f"/proc/self/ns/{kind}").removeprefix(f"{kind}:")
    except OSError:  # a kernel without time namespaces has the one monotonic clock
        return "-"


def _started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks after boot); None if there is no such
    process, or only its zombie (killed, not yet reaped: it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the name before ")" may hold spaces
    if len(fields) <= 19 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


@functools.cache
def _me(pid: int) -> str | None:
    host, started = _host(), _started(pid)
    if host is None or started is None:
        return None
    return " ".join((*host, str(pid), started))


def me() -> str | None:
    """This process, as a lease's holder (None where it cannot be told)."""
    return _me(os.getpid())  # keyed on the pid: a child after fork() is another holder


def clock() -> str | None:
    """This host's monotonic clock, named by its boot id and time namespace (None off
    Linux): two readings on one name are comparable, whichever processes took them."""
    host = _host()
    return None if host is None else f"{host[0]} {host[1]}"


def steady_until(lease: timedelta, now: float | None = None) -> float:
    """When a lease taken now ends on this host's monotonic clock."""
    return (steady.monotonic() if now is None else now) + lease.total_seconds()


def alive_elsewhere(holder: str | None, until: float | None) -> bool:
    """Whether another process on this host holds that lease and is running, its end on the
    monotonic clock not past (the module docstring). This process itself is never
    "elsewhere": ``heartbeat.running_here`` knows which of its calls are running."""
    if holder is None or until is None:
        return False
    parts = holder.split(" ")
    host = _host()
    if host is None or len(parts) != 5 or tuple(parts[:2]) != host[:2]:
        return False  # another host (or time namespace): the ledger's clock decides
    if until < steady.monotonic():
        return False
    if parts[2] != host[2]:
        return True  # a process this one cannot see: alive until its monotonic end
    try:
        pid = int(parts[3])
    except ValueError:
        return False
    return pid != os.getpid() and _started(pid) == parts[4]


def saw_live(key: str, action_id: str, attempt: int, ends: datetime, now: datetime) -> None:
    """A lease ending at ``ends`` (the ledger's clock) was read live at ``now``: note when it
    ends on this host's monotonic clock, unless noted already (the first sight counts)."""
    seen = (key, action_id, attempt, ends)
    with _seen_lock:
        if seen in _seen:
            return
        _seen[seen] = steady.monotonic() + (ends - now).total_seconds()
        while len(_seen) > KEEP:
            _seen.popitem(last=False)


def seen_live(key: str, action_id: str, attempt: int, ends: datetime) -> bool:
    """Whether that lease, once seen live here, still has time left by the monotonic clock."""
    with _seen_lock:
        until = _seen.get((key, action_id, attempt, ends))
    return until is not None and steady.monotonic() <= until


def _after_fork() -> None:
    global _seen_lock  # the monotonic clock is the machine's: the notes hold in a child
    _seen_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)
