"""Result tables printed to a file or a pipe keep their headers and values whole."""

import io

from rich.console import Console
from rich.table import Table
from rich.text import Text

from meds_cli.core.report_console import print_table


def wide_table() -> Table:
    table = Table()
    for k in (1, 2, 4, 8, 16, 32, 64, 128):
        table.add_column(f"pass@{k}")
    table.add_column("benchmark")
    table.add_row(*[f"{56.25 + k:.2f}" for k in range(8)], "heldout-arithmetic")
    return table


def test_off_a_terminal_a_table_gets_its_natural_width():
    squeezed, whole = io.StringIO(), io.StringIO()
    Console(file=squeezed, width=80).print(wide_table())
    print_table(wide_table(), console=Console(file=whole, width=80))
    assert "pass@128" not in squeezed.getvalue()  # what rich alone does at 80 columns
    assert "pass@128" in whole.getvalue() and "63.25" in whole.getvalue() and "heldout-arithmetic" in whole.getvalue()


def test_on_a_terminal_the_window_width_holds():
    out = io.StringIO()
    print_table(wide_table(), console=Console(file=out, width=80, force_terminal=True))
    assert max(Text.from_ansi(line).cell_len for line in out.getvalue().splitlines()) <= 80
