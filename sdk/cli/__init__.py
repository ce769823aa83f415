"""The ``ctrlrun`` command: a thin shell over the library, one module per group of commands.

Exit codes: 0 ok, 1 refused or not found, 2 usage or configuration (a bad flag, a bad policy,
an unreachable store). Every command module imports only ``common`` and the library; this one
gathers them on ``main``, the console entry point (``ctrlrun = "ctrlrun.cli:main"``).
"""

from __future__ import annotations

import click

from . import approvals, budgets, console, doctor, effects, operators, policy, proxy, receipts


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="ctrlrun")
def main() -> None:
    """ctrlrun: an agent's consequential actions at most once, as policy allows, with a receipt.

    \b
    Start here:
      ctrlrun demo                       see it work against fake Stripe and Kubernetes
      ctrlrun init                       write a starter ctrlrun.yaml
      ctrlrun proxy --policy ctrlrun.yaml   run the sidecar proxy
      ctrlrun receipts                   read what happened
      ctrlrun console                    the operator console in a browser
    """


COMMANDS = (
    policy.init,
    policy.policy,
    receipts.receipts,
    receipts.inspect_cmd,
    receipts.stats,
    effects.effects,
    effects.resolve,
    effects.reconcile,
    doctor.doctor,
    approvals.approvals,
    approvals.approve,
    approvals.deny,
    operators.freeze,
    operators.unfreeze,
    operators.freezes,
    budgets.budgets,
    console.console,
    proxy.proxy,
    proxy.demo,
)
for _command in COMMANDS:
    main.add_command(_command)

__all__ = ["main"]
