"""`meds export`: a run's checkpoint as a folder that `AutoModelForCausalLM.from_pretrained` loads.

The model is rebuilt the way `meds eval` rebuilds it: the base model named in the run's
config.yaml, then the checkpoint (its peft adapter, or its trained weights: LoRA or every
weight). What is written:
  - a full-weight run: the whole model (config.json, model.safetensors);
  - a LoRA run with --merge: the adapter merged into the base, a plain model (vLLM reads it as it is);
  - a LoRA run without --merge: the peft adapter, its base named in adapter_config.json
    (base_model_name_or_path: the hub id, or the user's own model folder). A base that nobody can
    download by name (tiny-llama, the embedded SmolLM2, a .gguf file) is written beside the
    adapter and named "." (the folder itself, wherever it moves), so that from_pretrained on the
    folder finds both;
plus the tokenizer with its chat template and a model card (README.md). The folder is written
under a temporary name and renamed at the end, so a failed export leaves nothing half-written.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from meds_cli.core.errors import UserError
from meds_cli.core.hub import hub_reachable
from meds_cli.engine.model_io.model import EMBEDDED, TESTBED, TINY, load_model_and_tokenizer, resolve_model
from meds_cli.engine.model_io.model_card import CardInfo, model_card, read_evals
from meds_cli.engine.run_folders import run_dir as runs

# base_model_name_or_path of an adapter whose base is written beside it, in the same folder
SAME_FOLDER = "."
REPO_ID = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*/)?[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class ExportResult:
    folder: Path
    kind: str  # a key of model_card.KINDS
    step: int
    base: str  # what adapter_config.json names as the base ('' for merged and full exports)


def check_output(output: Path) -> None:
    """Refuse an output that holds anything: an export never overwrites."""
    output = Path(output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise UserError(f"--output '{output}' is not empty; choose a new folder (nothing was written)")


def check_repo_id(repo: str) -> None:
    if not REPO_ID.match(repo) or len(repo) > 96:
        raise UserError(f"--push-to-hub '{repo}' is not a repository id; write it as name or owner/name "
                        "(letters, digits, '-', '_', '.')")


def check_hub_reachable(repo: str) -> None:
    """Before anything is exported: a push that cannot happen is one line, not a late failure."""
    if not hub_reachable():
        raise UserError(f"--push-to-hub {repo}: the hub cannot be reached from here (offline, or HF_HUB_OFFLINE=1); "
                        f"export without --push-to-hub and upload the folder later with: hf upload {repo} DIR")


def describe_base(model_name: str) -> tuple[str | None, str | None]:
    """(hub id, the user's own model folder) of a run's base model; both None for a model that
    meds built or converted itself (tiny-llama, the embedded SmolLM2, the testbed base, a .gguf file)."""
    if model_name in (TINY, EMBEDDED, TESTBED) or model_name.endswith(".gguf"):
        return None, None
    source = resolve_model(model_name)
    if Path(source).expanduser().is_dir():
        return None, str(Path(source).expanduser().resolve())
    return source, None


def trained_policy(cfg, checkpoint: Path):
    """(model as trained, tokenizer, whether it is a peft LoRA model): the base model of the
    run's config with the checkpoint applied as `meds eval` applies it, the adapter unmerged."""
    from meds_cli.engine.rollout.eval_backends import ModelSpec, apply_checkpoint

    model, tokenizer = load_model_and_tokenizer(cfg.model.name, cfg.model.dtype)
    model = apply_checkpoint(model, ModelSpec(cfg.model.name, Path(checkpoint), cfg.model.dtype, cfg.model.lora),
                             merge=False)
    model.eval()
    return model, tokenizer, hasattr(model, "peft_config")


@contextlib.contextmanager
def _quiet_progress():
    """No 'Writing model shards' bars in the middle of the command's own output."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _name_base(folder: Path, base: str) -> None:
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    config["base_model_name_or_path"] = base
    path.write_text(json.dumps(config, indent=2) + "\n")


def export_run(run_dir, output, *, step: int | None = None, merge: bool = False) -> ExportResult:
    """Write the export of RUN's checkpoint (the last, or `step`) into `output`, which must be new or empty."""
    from meds_cli.engine.config import load_config, to_dict

    run_dir = runs.resolve_run_dir(str(run_dir))
    output = Path(output)
    check_output(output)
    cfg = load_config([str(run_dir / "config.yaml")])
    checkpoint = runs.find_checkpoint(run_dir, step)
    checkpoint_step = int(checkpoint.name.rsplit("_", 1)[-1])
    hub_id, own_folder = describe_base(cfg.model.name)
    staging = output.with_name(f".{output.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    base_named = ""
    try:
        with _quiet_progress():
            model, tokenizer, is_lora = trained_policy(cfg, checkpoint)
            if not is_lora:
                kind = "full"
                model.save_pretrained(staging)
            elif merge:
                kind = "merged"
                model.merge_and_unload().save_pretrained(staging)
            else:
                kind = "adapter" if (hub_id or own_folder) else "adapter+base"
                model.save_pretrained(staging)  # adapter_config.json + adapter_model.safetensors
                # the base beside the adapter is the folder itself, named relatively so that the folder
                # can move: transformers loads a folder with a config.json as the base without reading this
                base_named = hub_id or own_folder or SAME_FOLDER
                _name_base(staging, base_named)
                if kind == "adapter+base":
                    # The bare base beside the adapter: from_pretrained on a folder with both a
                    # config.json and an adapter loads the base from the folder, then the adapter.
                    model.unload().save_pretrained(staging)
            tokenizer.save_pretrained(staging)
        card = CardInfo(run_name=run_dir.name, kind=kind, model_name=cfg.model.name, hub_id=hub_id,
                        step=checkpoint_step, config=to_dict(cfg), evals=read_evals(run_dir),
                        last_metrics=_last_row(runs.MetricsLog(run_dir / "metrics.jsonl").rows(), checkpoint_step))
        (staging / "README.md").write_text(model_card(card))
        if output.is_dir():
            output.rmdir()  # empty, checked above
        output.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging, output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ExportResult(output, kind, checkpoint_step, base_named)


def _last_row(rows: list[dict], step: int) -> dict:
    """The metrics row of the exported step (or the last one before it)."""
    before = [row for row in rows if row.get("step", 0) <= step]
    return before[-1] if before else {}


def push_to_hub(folder: Path, repo: str, api=None) -> str:
    """Upload an export folder to a hub model repository (created when missing); the URL."""
    check_hub_reachable(repo)
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi()
    try:
        api.create_repo(repo_id=repo, repo_type="model", exist_ok=True)
        commit = api.upload_folder(folder_path=str(folder), repo_id=repo, repo_type="model",
                                   commit_message="Upload model exported by meds")
    except Exception as error:  # auth, permissions, network: one line, the export stays on disk
        detail = str(error).splitlines()[0][:200] if str(error) else ""
        raise UserError(f"--push-to-hub {repo} failed ({type(error).__name__}: {detail}); "
                        f"the export is in {folder}: upload it later with: hf upload {repo} {folder}") from None
    return str(getattr(commit, "commit_url", "") or f"https://huggingface.co/{repo}")
