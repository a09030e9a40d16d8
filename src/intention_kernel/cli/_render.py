"""Printing for the CLI: stored data goes out verbatim.

Keys, thread IDs, errors and notes come from applications, providers and operators.
Rich would read ``[...]`` in them as markup.
A stray closing tag would crash the command.
A style tag would vanish from a key an operator must copy.
Rich would also read ``:name:`` as an emoji code.
So every console here has markup, emoji and highlighting off.
Styled output is built from :class:`rich.text.Text`, which Rich never parses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.console import Console
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

__all__ = ["STATUS_STYLE", "console", "print_records", "status_text", "table"]

#: Receipt and step statuses, by how much an operator should look at them.
STATUS_STYLE = {
    "completed": "green",
    "prepared": "yellow",
    "awaiting_confirmation": "yellow",
    "rejected": "dim",
    "failed": "red",
    "uncertain": "bold red",
}


#: The narrowest a free-text column may be in a table, else rows print as blocks.
FREE_MIN_WIDTH = 24
#: A width no terminal has, to measure a table's natural width.
_UNBOUNDED = 1_000_000


def console(*, stderr: bool = False) -> Console:
    """A console that prints strings as they are: no markup, no emoji codes, no
    highlighting (give styles with :class:`~rich.text.Text`)."""
    return Console(stderr=stderr, markup=False, emoji=False, highlight=False)


def status_text(status: object) -> Text:
    """A status, styled by its meaning; never wrapped inside a table cell."""
    value = str(status)
    return Text(value, style=STATUS_STYLE.get(value, ""), no_wrap=True)


def table(
    title: str,
    *columns: str,
    whole: tuple[str, ...] = (),
    narrow: Mapping[str, int] | None = None,
) -> Table:
    """A table of data.

    Every column folds what does not fit, character by character, so no text is cut.
    The ``whole`` columns (keys, statuses) are never wrapped at their spaces.
    They keep their width while the others shrink.
    A ``narrow`` column folds at the width it names.
    That suits a long JSON value that would crowd out the rest.
    """
    result = Table(title=Text(title), title_justify="left")
    widths = narrow or {}
    for column in columns:
        result.add_column(
            Text(column), overflow="fold", no_wrap=column in whole, max_width=widths.get(column)
        )
    return result


def print_records(
    out: Console,
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Text]],
    *,
    whole: tuple[str, ...],
    free: str | None = None,
    narrow: Mapping[str, int] | None = None,
) -> None:
    """Print ``rows`` as a table when it fits the terminal, else as one block per row.

    A block has the ``whole`` columns on its first line.
    Each other column has a line of its own.
    A table squeezed into a narrow terminal would break the keys an operator copies.
    Or it would shrink its other columns to nothing.
    The table fits when every column has its natural width, except ``free``.
    ``free`` is a note or an error; it wraps in what is left.
    What is left must be at least :data:`FREE_MIN_WIDTH`.
    The ``narrow`` columns fold at the widths they name in a table.
    A block shows them whole.
    """
    listing = table(title, *columns, whole=whole, narrow=narrow)
    fixed = table(title, *(c for c in columns if c != free), whole=whole, narrow=narrow)
    for row in rows:
        listing.add_row(*row)
        fixed.add_row(*(cell for c, cell in zip(columns, row, strict=True) if c != free))
    needed = Measurement.get(out, out.options.update_width(_UNBOUNDED), fixed).maximum
    if free is not None:
        needed += FREE_MIN_WIDTH + 3  # the column's padding and border
    if needed <= out.width:
        out.print(listing)
        return
    out.print(Text(title))
    for row in rows:
        cells = dict(zip(columns, row, strict=True))
        head = Text("  ").join(cells[c] for c in whole)
        head.no_wrap, head.overflow = True, "fold"  # a key longer than a line folds whole
        details = Table.grid(padding=(0, 2))
        details.add_column(no_wrap=True)
        details.add_column(overflow="fold")
        for column, cell in cells.items():
            if column not in whole and cell.plain:
                details.add_row(Text(column), cell)
        out.print()
        out.print(head)
        out.print(Padding(details, (0, 0, 0, 2), expand=False))
