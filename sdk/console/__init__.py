"""The operator console: ``ctrlrun console``, a small server-rendered web page over the ledger.

Pending approvals (approve or deny), ambiguous effects (settle committed or failed, with a
note, after a hint naming what to look up at the remote), recent receipts with the chain's
status, and the freeze switch. Operators log in with the token their ``operators:`` entry
names; every act is recorded under their name through the same kernel functions the CLI
calls. Standard library only (``http.server``), no script: it works with JavaScript off.

Modules: ``server`` (start-up checks, the listener), ``routes`` (requests, sessions, CSRF),
``auth`` (tokens and sessions), ``scope`` (each login's secret path, where its cookie goes),
``forms`` (what a POST carries), ``board`` (what the pages read), ``acts`` (what operators
do), ``pages`` and ``html`` (rendering), ``hints`` (what to check at the remote).
Imported only by the ``console`` command: ``import ctrlrun`` does not load it.
"""

from __future__ import annotations

from .server import DEFAULT_LISTEN, ConsoleServer, ConsoleSettings, build

__all__ = ["DEFAULT_LISTEN", "ConsoleServer", "ConsoleSettings", "build"]
