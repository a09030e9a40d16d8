"""Help pages without type placeholders.

Typer prints a type beside every option that has no metavar.
It prints ``<bool>`` beside a flag, and ``<str>`` beside a text option or an argument.
A flag takes no value, so it shows none.
Every option that takes a value names it with a metavar (``--status STATUS``).
An argument's metavar is its name.
Commands and groups are built with :class:`Command` and :class:`Group`.
So the flags Typer adds (``--help``) follow the same rule.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

__all__ = ["Command", "Group"]


def _without_flag_types(command: Any, ctx: Any) -> None:
    for param in [*command.params, command.get_help_option(ctx)]:
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""  # shown as is: nothing
        elif isinstance(param, TyperArgument):
            # Its name column already shows the metavar (THREAD); Typer would add <str>.
            param.display_type_rich = _no_type  # type: ignore[method-assign]


def _no_type(ctx: Any) -> None:
    return None


class Command(TyperCommand):
    """A command whose flags show no type in ``--help``."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _without_flag_types(self, ctx)
        super().format_help(ctx, formatter)


class Group(TyperGroup):
    """A command group whose flags show no type in ``--help``."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _without_flag_types(self, ctx)
        super().format_help(ctx, formatter)
