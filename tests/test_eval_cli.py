"""`meds eval` end to end on the tiny model (and, marked slow, the embedded SmolLM2): the files it
writes, pass@k recomputed from samples.jsonl, resume, --compare, a trained run's checkpoint,
and bad input answered with one line."""

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from benchmarks.answer_extraction import answer_key
from benchmarks.passk import maj_at_k, pass_at_k
from meds_cli.app import app
from meds_cli.engine.rollout import eval_backends
from meds_cli.engine.rollout.eval_backends import ModelSpec, apply_checkpoint
from tests.cli_errors import one_error_line
from tests.conftest import needs_embedded, tiny_config

runner = CliRunner()
DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
# The tiny model's character vocabulary: no capitals, no '?' (problems stay inside it).
ROWS = [{"problem": "compute 1+1", "answer": "2"}, {"problem": "compute 2*3", "answer": "6"},
        {"problem": "compute 9-4", "answer": "5"}, {"problem": "compute 7+1", "answer": "8"}]
TINY = ["--model", "tiny-llama", "--benchmarks", "math500", "--k", "2", "--n", "4", "--max-new-tokens", "12",
        "--temperature", "1.0", "--top-p", "1.0", "-q"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Two threads on a busy two-core machine make the tiny model ten times slower.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    (folder / "math500").mkdir()
    (folder / "math500" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return folder


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def generate_calls(monkeypatch):
    """Problems handed to the HF backend, in order (the real generate still runs)."""
    seen = []
    real = eval_backends.HFBackend.generate

    def counting(self, requests):
        seen.extend(r.prompt.splitlines()[0] for r in requests)
        return real(self, requests)

    monkeypatch.setattr(eval_backends.HFBackend, "generate", counting)
    return seen


@pytest.fixture(scope="module")
def tiny_eval(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("tiny_eval")
    result = invoke("eval", *TINY, "--data-dir", data_dir, "--limit", "3", "--output", out)
    assert result.exit_code == 0, result.output
    return out


def test_eval_writes_results_samples_and_plot(tiny_eval):
    results = json.loads((tiny_eval / "results.json").read_text())
    samples = [json.loads(line) for line in (tiny_eval / "samples.jsonl").read_text().splitlines()]
    assert (tiny_eval / "pass_at_k.png").stat().st_size > 1000
    assert len(samples) == 3 * 4
    assert ({(s["problem_id"], s["sample"]) for s in samples}
            == {(f"math500/{i}", j) for i in range(3) for j in range(4)})
    for s in samples:
        assert {"response", "extracted", "correct", "outcome", "length", "truncated"} <= set(s)
    scores = results["benchmarks"]["math500"]
    by_problem = {}
    for s in sorted(samples, key=lambda s: s["sample"]):
        by_problem.setdefault(s["problem_id"], []).append(s)
    for k in (1, 2):
        expected = sum(pass_at_k(4, sum(s["correct"] for s in rows), k) for rows in by_problem.values()) / 3
        assert scores["pass@k"][str(k)] == pytest.approx(expected)
        majority = sum(maj_at_k([s["extracted"] for s in rows], [s["correct"] for s in rows], k, answer_key)
                       for rows in by_problem.values()) / 3
        assert scores["maj@k"][str(k)] == pytest.approx(majority)
    assert scores["mean_response_length"] == pytest.approx(sum(s["length"] for s in samples) / 12)
    assert scores["truncated_share"] == pytest.approx(sum(s["truncated"] for s in samples) / 12)
    assert results["config"]["n"] == 4 and results["config"]["k"] == 2 and results["model"] == "tiny-llama"
    assert results["average"]["pass@k"] == scores["pass@k"]
    assert "commit" in results and results["backend"] == "hf"
    assert results["timing"]["generate_s"] > 0


def test_resume_does_not_regenerate(tmp_path, data_dir, generate_calls):
    out = tmp_path / "ev"
    first = invoke("eval", *TINY, "--data-dir", data_dir, "--limit", "2", "--output", out)
    assert first.exit_code == 0, first.output
    assert generate_calls == ["compute 1+1", "compute 2*3"]
    before = (out / "samples.jsonl").read_text()
    second = invoke("eval", *TINY, "--data-dir", data_dir, "--limit", "4", "--output", out)
    assert second.exit_code == 0, second.output
    assert generate_calls[2:] == ["compute 9-4", "compute 7+1"]  # problems 1 and 2 reused
    after = (out / "samples.jsonl").read_text()
    assert after.startswith(before) and len(after.splitlines()) == 16
    assert json.loads((out / "results.json").read_text())["benchmarks"]["math500"]["problems"] == 4


def test_same_seed_same_samples(tmp_path, data_dir, tiny_eval):
    out = tmp_path / "again"
    assert invoke("eval", *TINY, "--data-dir", data_dir, "--limit", "3", "--output", out).exit_code == 0

    def responses(folder):
        return [(s["problem_id"], s["sample"], s["response"])
                for s in map(json.loads, (folder / "samples.jsonl").read_text().splitlines())]

    assert sorted(responses(out)) == sorted(responses(tiny_eval))


def test_compare_two_evals(tmp_path, tiny_eval):
    other = tmp_path / "other"
    other.mkdir()
    doc = json.loads((tiny_eval / "results.json").read_text())
    doc["model"] = "better"
    doc["benchmarks"]["math500"]["pass@k"] = {"1": 0.5, "2": 0.75}
    doc["benchmarks"]["math500"].update(truncated=3, truncated_share=0.25)  # the report warns above 10%
    (other / "results.json").write_text(json.dumps(doc))
    result = invoke("eval", "--compare", tiny_eval, other / "results.json", "--output", tmp_path / "cmp")
    assert result.exit_code == 0, result.output
    assert "better" in result.output and "tiny-llama" in result.output and "75.0" in result.output
    text = " ".join(result.output.split())
    assert "3 (25.0%)" in text  # the truncated column
    assert "better: more than 10% of the responses hit the" in text and "--max-new-tokens" in text
    assert (tmp_path / "cmp" / "pass_at_k.png").stat().st_size > 1000
    labels = [e["label"] for e in json.loads((tmp_path / "cmp" / "compare.json").read_text())["evals"]]
    assert labels == ["tiny-llama", "better"]


def test_bad_benchmark_name_is_one_line():
    line = one_error_line(invoke("eval", "--model", "tiny-llama", "--benchmarks", "math500,aime2024"))
    assert "aime2024" in line and "did you mean 'aime24'" in line


@pytest.mark.parametrize("args, words", [
    (["--model", "tiny-llama", "--backend", "vllm"], ["vllm"]),
    (["--model", "tiny-llama", "--k", "8", "--n", "4"], ["--n (4)", "--k (8)"]),
    (["--model", "tiny-llama", "--data-dir", "/nonexistent/data"], ["/nonexistent/data"]),
    ([], ["run folder", "--model"]),
    (["--compare", "/nonexistent/a", "/nonexistent/b"], ["/nonexistent/a", "results.json"]),
])
def test_bad_input_is_one_line(args, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no runs/ folder: after `make train` the checkout has one, which eval would take
    line = one_error_line(invoke("eval", *args))
    for word in words:
        assert word in line, line


def test_eval_of_a_trained_run(tmp_path, data_dir):
    from meds_cli.engine.config import dump_yaml
    from meds_cli.engine.trainer import Trainer

    run_dir = tmp_path / "run"
    cfg = tiny_config("train.steps=1", "optim.lr=0.05", output_dir=run_dir)
    Trainer(cfg, run_dir).train()
    dump_yaml(cfg, run_dir / "config.yaml")
    result = invoke("eval", run_dir, "--benchmarks", "math500", "--data-dir", data_dir, "--limit", "2", "--k", "2",
                    "--max-new-tokens", "8", "-q")
    assert result.exit_code == 0, result.output
    results = json.loads((run_dir / "eval" / "step_1" / "results.json").read_text())
    assert results["model"] == "run@step_1" and results["checkpoint"].endswith("step_1")
    # the adapter really is applied: the evaluated weights differ from the base model's
    spec = ModelSpec("tiny-llama", run_dir / "checkpoints" / "step_1")
    tuned, _ = eval_backends.load_hf_policy(spec)
    base, _ = eval_backends.load_hf_policy(ModelSpec("tiny-llama"))
    changed = [n for n, p in tuned.state_dict().items() if not torch.equal(p, base.state_dict()[n])]
    assert changed and all("lora" not in n for n in tuned.state_dict())
    assert one_error_line(invoke("eval", run_dir, "--step", "7", "--benchmarks", "math500"))  # no such checkpoint


def test_full_weights_checkpoint(tmp_path):
    from safetensors.torch import save_file

    from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer

    model, _ = tiny_model_and_tokenizer()
    name = "lm_head.weight"
    save_file({name: torch.full_like(model.state_dict()[name], 0.5)}, str(tmp_path / "weights.safetensors"))
    loaded = apply_checkpoint(tiny_model_and_tokenizer()[0], ModelSpec("tiny-llama", tmp_path))
    assert torch.all(loaded.state_dict()[name] == 0.5)
    save_file({"nope.weight": torch.zeros(2)}, str(tmp_path / "weights.safetensors"))
    with pytest.raises(Exception, match="does not match model 'tiny-llama'"):
        apply_checkpoint(tiny_model_and_tokenizer()[0], ModelSpec("tiny-llama", tmp_path))


@pytest.mark.slow
@needs_embedded
@pytest.mark.skipif(not (DATA / "math500").is_dir(), reason="no shared benchmark data")
def test_embedded_model_on_math500(tmp_path):
    out = tmp_path / "smol"
    result = invoke("eval", "--model", "smollm2-135m", "--benchmarks", "math500", "--data-dir", DATA, "--limit", "2",
                    "--k", "2", "--max-new-tokens", "64", "--prompt", "chat", "--output", out, "-q")
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    scores = results["benchmarks"]["math500"]
    assert scores["problems"] == 2 and scores["n"] == 2 and set(scores["pass@k"]) == {"1", "2"}
    assert 0 < scores["mean_response_length"] <= 64
    assert len((out / "samples.jsonl").read_text().splitlines()) == 4
