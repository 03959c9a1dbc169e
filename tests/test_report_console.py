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


def test_on_a_narrow_terminal_a_wide_table_splits_and_keeps_every_number_whole():
    # issue 54: the ablation summary in a 100-column terminal read `0.6…` and `pass…`
    from meds_cli.commands.ablate_report import METRICS, rich_table

    rows = []
    for name in ("baseline-dapo", "features-logits", "features-random"):
        row = {"variant": name, "seeds": 3, "setup": "meds on dapo, meds.alpha=0.1, meds.features=logits"}
        for i, (key, _) in enumerate(METRICS):
            row[key], row[f"{key}_std"] = 0.625 + i / 1000, 0.034
        rows.append(row)
    for width in (80, 100):
        out = io.StringIO()
        print_table(rich_table(rows, 8, "ablation runs/ablate-x"), console=Console(file=out, width=width,
                                                                                    force_terminal=True))
        text = Text.from_ansi(out.getvalue()).plain
        assert "…" not in text, text
        assert max(len(line) for line in text.splitlines()) <= width
        for i, (_, header) in enumerate(METRICS):
            assert f"{0.625 + i / 1000:.3f}±0.034" in text, (width, header)
        for header in ("pass@1", "pass@8", "distinct wrong", "s/step"):
            assert header in " ".join(text.split()), (width, header)
        assert text.count("features-random") >= 2  # the row names repeat in every part


def test_a_trainer_line_naming_a_path_stays_one_line_in_a_log(capsys):
    # issue 54: the precision line broke at 80 columns mid-path when stderr was a file
    from types import SimpleNamespace

    from meds_cli.engine.trainer_parts import say

    path = "/scratch/someone/runs/" + "a-long-folder-name/" * 8 + "config.yaml"
    say(SimpleNamespace(is_main_process=True), f"precision: bf16 (calibrated, see {path})")
    assert capsys.readouterr().err == f"precision: bf16 (calibrated, see {path})\n"
