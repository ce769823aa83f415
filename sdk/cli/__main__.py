"""``python -m ctrlrun.cli``: the same as the ``ctrlrun`` console script."""

from __future__ import annotations

from . import main

main()
