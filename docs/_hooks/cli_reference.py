"""MkDocs hook: the command-line reference, generated from the CLI itself.

A page that holds the marker ``<!-- cli-reference -->`` gets, in its place, one
section per command of ``intention-kernel``. Each section shows the usage line, the
command's help and a table of its arguments and options. The text comes from the
typer application, so the page cannot drift from ``--help``. A command without help
text fails the build: the reference would show an empty section.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperArgument, TyperOption

MARKER = "<!-- cli-reference -->"


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace the marker with the reference of every command."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render_reference())


def render_reference() -> str:
    """Every command of the CLI, depth first, in the order ``--help`` lists them."""
    import typer.main

    from intention_kernel.cli._app import app

    root = typer.main.get_command(app)
    sections: list[str] = []
    _walk(root, ["intention-kernel"], sections)
    return "\n".join(sections)


def _walk(command: Any, path: list[str], out: list[str]) -> None:
    # typer ships its own copy of click, so commands are told apart by what they offer.
    ctx = typer.Context(command, info_name=" ".join(path))
    if len(path) > 1:
        out.append(_section(command, ctx, path))
    if hasattr(command, "list_commands"):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                _walk(sub, [*path, name], out)


def _section(command: Any, ctx: Any, path: list[str]) -> str:
    helptext = (command.help or "").strip()
    if not helptext:
        raise ValueError(f"the command {' '.join(path)!r} has no help text")
    level = "#" * min(len(path), 4)
    pieces = command.collect_usage_pieces(ctx)
    usage = " ".join([*path, *pieces])
    lines = [f"{level} `{' '.join(path[1:])}`", "", "```text", usage, "```", "", helptext, ""]
    rows = [_row(param, ctx) for param in command.get_params(ctx)]
    rows = [row for row in rows if row is not None]
    if rows:
        lines += ["| argument or option | meaning |", "| --- | --- |", *rows, ""]
    return "\n".join(lines)


def _row(param: Any, ctx: Any) -> str | None:
    if isinstance(param, TyperOption):
        if param.hidden:
            return None
        names = ", ".join(f"`{name}`" for name in [*param.opts, *param.secondary_opts])
        if param.metavar and not param.is_flag:
            names += f" `{param.metavar}`"
        meaning = (param.help or "").replace("\\[", "[")
        if param.required:
            meaning += " (required)"
        return f"| {names} | {_cell(meaning)} |"
    if isinstance(param, TyperArgument):
        name = param.metavar or (param.name or "").upper()
        meaning = getattr(param, "help", None) or ""
        if not param.required:
            meaning += " (optional)"
        return f"| `{name}` | {_cell(meaning)} |"
    return None


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")
