"""The console a command prints its result tables to.

On a terminal rich fits a table to the window by cutting its cells: in a 100-column terminal the
ablation summary read `0.6…` and `pass…`. Written to a file or a pipe (a cluster job's log,
`| tee`), rich assumes 80 columns, and a pass@k table to 128 has fourteen columns: every header
came out cut to "pas…" and every score to "56…". So off a terminal a table gets the width it
needs, and on a terminal a table wider than the window is printed as several narrower tables,
each repeating the first column (what a row is) beside a share of the others: every number
whole, at any width a row's name and one number fit in.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def print_table(table: Table, console: Console | None = None, keep: int = 1) -> None:
    """Print `table` whole: at its natural width off a terminal; on a terminal, split by columns
    (the first `keep` repeated in every part) where it is wider than the window."""
    console = console or Console()
    natural = _natural_width(console, table)
    if not console.is_terminal:
        Console(file=console.file, width=max(console.width, natural)).print(table)
        return
    parts = [table] if natural <= console.width else split_columns(console, table, console.width, keep)
    for part in parts:
        console.print(part)


def _natural_width(console: Console, table: Table) -> int:
    return console.measure(table, options=console.options.update_width(10_000)).maximum


def _column_width(console: Console, table: Table, index: int) -> int:
    """Cells and header of one column on one line, with the padding and rule around it."""
    column = table.columns[index]
    cells = [column.header, *column._cells]
    widest = max(console.measure(console.render_str(c) if isinstance(c, str) else c).maximum for c in cells)
    return widest + 2 * table.padding[1] + 1


def split_columns(console: Console, table: Table, width: int, keep: int = 1) -> list[Table]:
    """`table` as several tables no wider than `width` where columns allow: the first `keep`
    columns in each, the others packed in order; the title on the first, the caption on the last.
    A column too wide for any part on its own gets a part to itself (rich wraps its text)."""
    widths = [_column_width(console, table, i) for i in range(len(table.columns))]
    fixed = sum(widths[:keep]) + 1
    groups: list[list[int]] = []
    for index in range(keep, len(table.columns)):
        if groups and fixed + sum(widths[i] for i in groups[-1]) + widths[index] <= width:
            groups[-1].append(index)
        else:
            groups.append([index])
    parts = []
    for number, group in enumerate(groups):
        part = Table(title=table.title if number == 0 else None, title_justify=table.title_justify,
                     caption=table.caption if number == len(groups) - 1 else None,
                     caption_justify=table.caption_justify, show_header=table.show_header, box=table.box,
                     padding=table.padding)
        for index in [*range(keep), *group]:
            column = table.columns[index]
            part.add_column(column.header, justify=column.justify, no_wrap=column.no_wrap, overflow=column.overflow,
                            style=column.style)
        for row_index, row in enumerate(table.rows):
            part.add_row(*(table.columns[i]._cells[row_index] for i in [*range(keep), *group]),
                         end_section=row.end_section)
        parts.append(part)
    return parts
