"""Help pages without type placeholders.

Typer prints a type beside every option that has no metavar (``<bool>`` beside a flag,
``<str>`` beside a text option or an argument). A flag takes no value, so it shows
none; every option that takes one names its value with a metavar (``--status
STATUS``), and an argument's metavar is its name. Commands and
groups are built with :class:`Command` and :class:`Group` so that the flags Typer
adds (``--help``) follow the same rule.
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
