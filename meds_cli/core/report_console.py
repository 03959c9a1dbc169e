"""The console a command prints its result tables to.

On a terminal rich fits a table to the window. Written to a file or a pipe (a cluster job's log,
`| tee`), rich assumes 80 columns, and a pass@k table to 128 has fourteen columns: every header
came out cut to "pas…" and every score to "56…". Off a terminal the table gets the width it needs.
"""

from __future__ import annotations

from rich.console import Console


def print_table(table, console: Console | None = None) -> None:
    """Print `table` whole: at the terminal's width on a terminal, else at its natural width."""
    console = console or Console()
    if console.is_terminal:
        console.print(table)
        return
    natural = console.measure(table, options=console.options.update_width(10_000)).maximum
    Console(file=console.file, width=max(console.width, natural)).print(table)
