"""The typer application: one root, and every command group registered on it.

To add a group, write ``cli/<name>.py`` with a ``register(app)`` function and add
it to :data:`GROUPS`. Importing this module needs the ``cli`` extra.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer

from intention_kernel import __version__
from intention_kernel.cli import _demo as demo
from intention_kernel.cli import _deploy as deploy
from intention_kernel.cli import _interactions as interactions
from intention_kernel.cli import _outbox as outbox
from intention_kernel.cli import _prune as prune
from intention_kernel.cli import _receipts as receipts
from intention_kernel.cli import _serve as serve
from intention_kernel.cli import _threads as threads
from intention_kernel.cli import _timers as timers
from intention_kernel.cli._help import Group

__all__ = ["GROUPS", "app"]

#: Every command module, in the order ``--help`` lists them.
GROUPS: tuple[Callable[[typer.Typer], None], ...] = (
    demo.register,
    serve.register,
    receipts.register,
    outbox.register,
    deploy.register,
    prune.register,
    interactions.register,
    threads.register,
    timers.register,
)

app = typer.Typer(
    name="intention-kernel",
    cls=Group,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"intention-kernel {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_show_version, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
) -> None:
    """Durable turns for conversational agents that act on the world.

    Store commands take --db URL (sqlite:///path.db or postgresql://...).

    Without it they use $INTENTION_KERNEL_DB, then sqlite:///intention-kernel.db.
    """


for register in GROUPS:
    register(app)
