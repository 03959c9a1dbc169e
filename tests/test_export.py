"""meds export: the exported folder loads with from_pretrained and gives the trained policy's logits
(LoRA merged, LoRA adapter, all weights), carries the tokenizer and a model card, and never overwrites."""

import json

import pytest
import torch

from meds_cli.core.errors import UserError
from meds_cli.engine import export as export_module
from meds_cli.engine.config import dump_yaml
from meds_cli.engine.export import check_repo_id, export_run, push_to_hub
from meds_cli.engine.trainer import Trainer
from tests.conftest import tiny_config

# A large learning rate, so two steps move the weights far from the base (and a missed adapter shows).
TRAIN = ("train.steps=2", "optim.lr=0.05", "rollout.prompts_per_step=4", "rollout.group_size=4")
INPUTS = ["1=", "7=", "(3+4)*2=", "boxed{9}"]


def _train(run_dir, *overrides):
    """A finished 2-step tiny run with its config.yaml, as `meds train` leaves it; the trainer in memory."""
    cfg = tiny_config(*TRAIN, *overrides)
    trainer = Trainer(cfg, run_dir)
    trainer.train()
    dump_yaml(cfg, run_dir / "config.yaml", sections=trainer.algorithm.config_sections)
    return trainer


@torch.no_grad()
def _logits(model, tokenizer):
    model.eval()
    return [model(**tokenizer(text, return_tensors="pt", add_special_tokens=False)).logits[0] for text in INPUTS]


def _max_difference(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def _load(folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("lora-run")
    trainer = _train(run_dir)
    return run_dir, _logits(trainer.unwrapped, trainer.tokenizer), trainer.tokenizer


def _base_logits(tokenizer):
    from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer

    return _logits(tiny_model_and_tokenizer()[0], tokenizer)


@pytest.mark.parametrize("merge, kind", [(True, "merged"), (False, "adapter+base")])
def test_lora_exports_give_the_trained_policys_logits(lora_run, tmp_path, merge, kind):
    run_dir, trained, tokenizer = lora_run
    result = export_run(run_dir, tmp_path / "out", merge=merge)
    assert result.kind == kind and result.step == 2 and result.folder == tmp_path / "out"
    model, loaded_tokenizer = _load(tmp_path / "out")
    exported = _logits(model, loaded_tokenizer)
    assert _max_difference(exported, trained) < 1e-4
    assert _max_difference(_base_logits(tokenizer), trained) > 1e-2  # the training moved the policy
    files = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= files
    assert ("adapter_config.json" in files) == (not merge)
    assert not list(tmp_path.glob(".out.partial-*"))


def test_the_adapter_names_its_base(lora_run, tmp_path):
    run_dir, _, _ = lora_run
    result = export_run(run_dir, tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    # tiny-llama has no hub id: its weights sit in the folder, which the adapter names relatively
    # (issue 54: an absolute path broke when the folder moved)
    assert config["base_model_name_or_path"] == result.base == "."
    assert config["r"] == 8
    moved = tmp_path / "elsewhere" / "adapter"
    moved.parent.mkdir()
    (tmp_path / "adapter").rename(moved)
    model, tokenizer = _load(moved)
    assert _max_difference(_logits(model, tokenizer), lora_run[1]) < 1e-4


def test_a_full_weight_run_exports_and_loads(tmp_path):
    trainer = _train(tmp_path / "run", "model.lora.enabled=false")
    trained = _logits(trainer.unwrapped, trainer.tokenizer)
    result = export_run(tmp_path / "run", tmp_path / "out")
    assert result.kind == "full"
    model, tokenizer = _load(tmp_path / "out")
    assert _max_difference(_logits(model, tokenizer), trained) < 1e-5
    assert _max_difference(_base_logits(tokenizer), trained) > 1e-2


def test_the_model_card_carries_algorithm_config_and_evals(lora_run, tmp_path):
    run_dir, _, _ = lora_run
    eval_dir = run_dir / "eval" / "step_2"
    eval_dir.mkdir(parents=True, exist_ok=True)
    document = {"config": {"n": 4},
                "benchmarks": {"math500": {"problems": 50, "pass@k": {"1": 0.25, "2": 0.4, "4": 0.5},
                                           "maj@k": {"4": 0.3}}}}
    (eval_dir / "results.json").write_text(json.dumps(document))
    try:
        export_run(run_dir, tmp_path / "out", merge=True)
    finally:
        (eval_dir / "results.json").unlink()
    card = (tmp_path / "out" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\n")
    assert "algorithm **grpo**" in card and "base model `tiny-llama`" in card and "checkpoint of step 2 of 2" in card
    assert "| step_2 | math500 | 50 | 4 | 25.0 | 50.0 (k=4) | 30.0 |" in card
    assert "scale_rewards: group" in card  # the algorithm's settings
    assert "prompts_per_step: 4" in card  # the full config
    assert "| reward |" in card  # the last metrics row


def test_the_tokenizer_keeps_its_chat_template(lora_run, tmp_path, monkeypatch):
    import meds_cli.engine.model_io.tiny as tiny

    template = "{% for m in messages %}{{ m['content'] }}={% endfor %}"
    plain = tiny.tiny_tokenizer

    def with_template():
        tokenizer = plain()
        tokenizer.chat_template = template
        return tokenizer

    monkeypatch.setattr(tiny, "tiny_tokenizer", with_template)
    export_run(lora_run[0], tmp_path / "out", merge=True)
    _, tokenizer = _load(tmp_path / "out")
    assert tokenizer.chat_template == template
    assert tokenizer.apply_chat_template([{"role": "user", "content": "12"}], tokenize=False) == "12="


def test_an_output_with_files_is_refused_and_left_alone(lora_run, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="--output '.*out' is not empty; choose a new folder"):
        export_run(lora_run[0], tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]
    (tmp_path / "empty").mkdir()
    assert export_run(lora_run[0], tmp_path / "empty", merge=True).kind == "merged"  # an empty folder is fine


def test_bad_run_and_step_are_one_line(lora_run, tmp_path):
    with pytest.raises(UserError, match="is not a run folder"):
        export_run(tmp_path, tmp_path / "out")
    with pytest.raises(UserError, match="no checkpoint at step 7; checkpoints: 2"):
        export_run(lora_run[0], tmp_path / "out", step=7)
    assert not (tmp_path / "out").exists()


class _FakeHub:
    def __init__(self, fail=None):
        self.calls, self.fail = [], fail

    def create_repo(self, **kwargs):
        self.calls.append(("create_repo", kwargs))

    def upload_folder(self, **kwargs):
        if self.fail:
            raise self.fail
        self.calls.append(("upload_folder", kwargs))

        class Commit:
            commit_url = "https://hub.example/me/model/commit/1"

        return Commit()


def test_push_to_hub_creates_the_repo_and_uploads_the_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(export_module, "hub_reachable", lambda: True)
    hub = _FakeHub()
    assert push_to_hub(tmp_path, "me/model", api=hub) == "https://hub.example/me/model/commit/1"
    assert hub.calls[0] == ("create_repo", {"repo_id": "me/model", "repo_type": "model", "exist_ok": True})
    assert hub.calls[1][0] == "upload_folder" and hub.calls[1][1]["folder_path"] == str(tmp_path)
    assert hub.calls[1][1]["repo_id"] == "me/model"


def test_push_to_hub_failures_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(export_module, "hub_reachable", lambda: False)
    with pytest.raises(UserError, match="--push-to-hub me/model: the hub cannot be reached from here"):
        push_to_hub(tmp_path, "me/model", api=_FakeHub())
    monkeypatch.setattr(export_module, "hub_reachable", lambda: True)
    with pytest.raises(UserError,
                       match=r"--push-to-hub me/model failed \(PermissionError: no write access\); the export is in"):
        push_to_hub(tmp_path, "me/model", api=_FakeHub(fail=PermissionError("no write access\ndetails")))
    with pytest.raises(UserError, match="is not a repository id"):
        check_repo_id("me/my model")
    check_repo_id("me/model-1.5B")


def test_the_base_is_named_by_hub_id_or_own_folder(tmp_path):
    from meds_cli.engine.export import describe_base
    from meds_cli.engine.model_io.model import model_aliases

    alias, hub_id = next(iter(model_aliases().items()))
    assert describe_base(alias) == (hub_id, None)
    assert describe_base("someone/some-model") == ("someone/some-model", None)
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    assert describe_base(str(tmp_path)) == (None, str(tmp_path.resolve()))
    assert describe_base("tiny-llama") == (None, None) and describe_base("smollm2-135m") == (None, None)


def test_an_adapter_card_names_its_hub_base_and_tells_vllm_users_what_to_do():
    from meds_cli.engine.model_io.model_card import CardInfo, model_card

    config = {"algo": {"name": "meds", "base": "dapo"}, "meds": {"alpha": 0.1}, "dapo": {"clip_high": 0.28},
              "task": {"name": "math", "prompt_style": "chat"}, "train": {"steps": 50}}
    card = model_card(CardInfo("20260101-meds", "adapter", "Qwen2.5-Math-1.5B", "Qwen/Qwen2.5-Math-1.5B", 50, config,
                               last_metrics={"step": 50, "reward": 0.5}))
    assert card.startswith("---\nlibrary_name: peft\n") and "base_model: Qwen/Qwen2.5-Math-1.5B" in card
    assert "algorithm **meds** on dapo" in card and "`chat` style" in card
    assert "LoRARequest" in card and "--merge" in card
    assert "alpha: 0.1" in card and "clip_high: 0.28" in card
    assert "No evaluation in the run folder yet" in card and "| reward | 0.5 |" in card
    front = card.split("---")[1]
    assert front.count("- meds\n") == 1 and "- reinforcement-learning" in front  # one tag per name


def test_the_export_command(lora_run, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from meds_cli.app import app

    run_dir = str(lora_run[0])
    runner = CliRunner()
    result = runner.invoke(app, ["export", run_dir, "--output", str(tmp_path / "m"), "--merge"])
    assert result.exit_code == 0, result.output
    assert "exported step 2" in result.output and (tmp_path / "m" / "config.json").is_file()
    # the libraries' warnings while exporting go to the run folder's log, not the terminal
    import warnings

    from meds_cli.core.library_warnings import LibraryWarnings

    assert isinstance(warnings.showwarning, LibraryWarnings)
    assert warnings.showwarning.path == lora_run[0] / "library_warnings.log"
    assert "FutureWarning" not in result.output

    def one_line(args, expected):
        result = runner.invoke(app, args)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2 and len(lines) == 1 and expected in lines[0], result.output

    one_line(["export", run_dir, "-o", str(tmp_path / "m")], "is not empty")
    monkeypatch.setattr(export_module, "hub_reachable", lambda: False)
    one_line(["export", run_dir, "-o", str(tmp_path / "p"), "--push-to-hub", "me/model"], "the hub cannot be reached")
    one_line(["export", run_dir, "-o", str(tmp_path / "p"), "--push-to-hub", "me/a model"], "is not a repository id")
    assert not (tmp_path / "p").exists()  # nothing exported when the push cannot happen
