"""`meds export RUN --output DIR [--step N] [--merge] [--push-to-hub REPO]`: a run's checkpoint as
a folder that transformers (and, merged, vLLM) load, with its tokenizer and a model card."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from meds_cli.core.errors import UserError
from meds_cli.core.markup import plain


def check_not_around_cwd(output: Path) -> None:
    """Refuse the folder the user is in (`.`) or one above it: an export replaces its output
    folder as a whole, which would pull the current folder away from under the shell."""
    here = Path.cwd().resolve()
    if here == Path(output).resolve() or Path(output).resolve() in here.parents:
        raise UserError(f"--output '{output}' is the folder you are in (or holds it); give the name of a new folder, "
                        f"e.g. --output ./exported (nothing was written)")


def export_command(
    run: Annotated[Path, typer.Argument(help="A run folder (its last checkpoint, or --step).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="New (or empty) folder to write the model into.")],
    step: Annotated[Optional[int], typer.Option(help="Checkpoint step to export (default: the latest).")] = None,
    merge: Annotated[bool, typer.Option(
        "--merge", help="Merge a LoRA adapter into the base weights (a plain model; what vLLM loads).")] = False,
    push_to_hub: Annotated[Optional[str], typer.Option(
        "--push-to-hub", help="Also upload the folder to this hub model repository (owner/name).")] = None,
) -> None:
    """Export a run's checkpoint: merged model or adapter, tokenizer, and a model card with the run's config and evals.
    """
    from meds_cli.engine.export import check_hub_reachable, check_output, check_repo_id, export_run
    from meds_cli.engine.export import push_to_hub as push

    console = Console(stderr=True, soft_wrap=True)
    check_not_around_cwd(output)
    check_output(output)
    if push_to_hub:
        check_repo_id(push_to_hub)
        check_hub_reachable(push_to_hub)
    from meds_cli.core.library_warnings import route_library_warnings
    from meds_cli.engine.run_folders.run_dir import resolve_run_dir

    # transformers' and peft's warnings while rebuilding and saving the model are theirs, not the
    # user's: they go to the run folder's library_warnings.log (beside training's), not the export
    route_library_warnings().log_to(resolve_run_dir(str(run)))
    with console.status(f"exporting {plain(run)} ..."):
        result = export_run(run, output, step=step, merge=merge)
    named = f" (base: {result.base})" if result.base else ""
    console.print(f"exported step {result.step} of [bold]{plain(run)}[/] as {plain(result.kind)}{plain(named)} "
                  f"to [bold]{plain(result.folder)}[/]", soft_wrap=True)
    if push_to_hub:
        with console.status(f"uploading to {plain(push_to_hub)} ..."):
            url = push(result.folder, push_to_hub)
        console.print(f"uploaded to {plain(url)}")

