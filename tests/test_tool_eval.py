"""`meds eval` with tools (docs/tools.md, docs/evaluation.md): --tools reaches the generation
settings the backend samples with, a run trained with tools is evaluated with them by default
(--tools none: without), bad values end in one line, and the report's tool columns come out end to
end, with pass@k graded on the model's own text. The backend here runs the real turn loop and
sandbox on a scripted engine (tests/scripted_tool_engine.py); the shipped TIR config loads."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.generation import Generated
from meds_cli.app import app
from meds_cli.commands import eval as eval_command
from meds_cli.engine.rollout.tools.turn_loop import ToolRuntime, TurnLimits, sample_with_tools
from tests import test_eval_cli
from tests.cli_errors import one_error_line
from tests.conftest import needs_embedded
from tests.scripted_tool_engine import CharTokenizer, ScriptedEngine

ROOT = Path(__file__).resolve().parent.parent
ROWS = test_eval_cli.ROWS
data_dir = test_eval_cli.data_dir  # the fixture: a math500 folder of ROWS
runner = CliRunner()
# Per problem ("compute 1+1", ...: tests/test_eval_cli.py's rows), two samples: the model checks its
# result with the tool and boxes it itself (right), or the tool prints the box and the model never
# writes one (wrong: the tool's box is no answer).
CHECKED = "```python\nprint({expr})\n```\nSo it is \\boxed{{{answer}}}."
TOOL_BOXED = "```python\nprint('\\\\boxed{{%d}}' % ({expr}))\n```\nThat is what the tool says."


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


class ScriptedToolBackend:
    """An eval backend that samples as an engine with tools does: the turn loop over a scripted
    engine, the blocks run in the sandbox. Without tools in its settings it returns the scripts as
    plain text, as a model that is never answered would leave them."""

    name = "hf"

    def __init__(self, generation):
        self.generation, self.tokenizer = generation, CharTokenizer()

    def call_sizes(self, requests):
        return [len(requests)] if requests else []

    def generate(self, requests):
        out = []
        for request in requests:
            expr = request.prompt.splitlines()[0].removeprefix("compute ")
            answer = eval(expr)  # the test's own rows: a sum, a product or a difference of digits
            scripts = [CHECKED.format(expr=expr, answer=answer), TOOL_BOXED.format(expr=expr)][: request.n]
            prompts = [f"{request.prompt}#{j}" for j in range(len(scripts))]  # each sample its own context
            if self.generation.tools is None:
                out.append(Generated(scripts, [len(s) for s in scripts], [False] * len(scripts)))
                continue
            engine = ScriptedEngine(prompts, scripts)
            runtime = ToolRuntime(engine.tokenizer, self.generation.tools, workers=1)
            responses = sample_with_tools(engine, engine.prompt_ids(), runtime,
                                          TurnLimits.of(self.generation.tools, self.generation.max_new_tokens))
            texts, spans = zip(*(r.text(engine.tokenizer.decode) for r in responses))
            out.append(Generated(list(texts), [sum(r.layout()[1]) for r in responses],
                                 [not r.finished for r in responses], [list(s) for s in spans],
                                 [r.stats for r in responses]))
        return out


@pytest.fixture
def backends(monkeypatch):
    """The generation settings of every backend `meds eval` builds, in order."""
    made = []

    def make(name, spec, generation):
        made.append(generation)
        return ScriptedToolBackend(generation)

    monkeypatch.setattr(eval_command, "make_backend", make)
    return made


def eval_args(data_dir, out, *extra):
    return ("eval", "--benchmarks", "math500", "--data-dir", data_dir, "--k", "2", "--prompt", "boxed",
            "--max-new-tokens", "200", "--backend", "hf", "--output", out, "-q", *extra)


def test_eval_with_tools_reports_the_tool_columns_and_grades_the_models_text(tmp_path, data_dir, backends):
    out = tmp_path / "tools"
    result = invoke(*eval_args(data_dir, out, "--model", "tiny-llama", "--tools", "python", "--max-tool-calls", "2",
                               "--tool-output-tokens", "64"))
    assert result.exit_code == 0, result.output
    (generation,) = backends
    assert generation.tools.tools == ["python"] and generation.tools.max_tool_calls == 2
    assert generation.tools.tool_output_tokens == 64
    assert "tools: python (--tools); at most 2 code runs a response, outputs cut at 64 tokens" in result.output
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["tools"] == ["python"] and results["config"]["max_tool_calls"] == 2
    scores = results["benchmarks"]["math500"]
    # every response ran one block, none failed; the tool's own box counts for nothing
    assert scores["tools"]["calls_per_response"] == 1.0 and scores["tools"]["used_share"] == 1.0
    assert scores["tools"]["errors_per_response"] == 0.0 and scores["tools"]["timeouts_per_response"] == 0.0
    assert scores["pass@k"]["1"] == 0.5 and scores["pass@k"]["2"] == 1.0
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    wrong = [r for r in rows if not r["correct"]]
    assert len(wrong) == len(ROWS) and all("```output\n\\boxed{" in r["response"] for r in wrong)  # shown, not graded
    assert all(r["tools"]["calls"] == 1 and r["tools"]["observation_tokens"] > 0 for r in rows)
    assert {r["extracted"] for r in rows if r["correct"]} == {row["answer"] for row in ROWS}
    for column in ("tool calls", "used tool", "tool errors", "tool time-outs"):
        assert column in result.output


def test_without_tools_there_are_no_tool_columns(tmp_path, data_dir, backends):
    result = invoke(*eval_args(data_dir, tmp_path / "plain", "--model", "tiny-llama"))
    assert result.exit_code == 0, result.output
    assert backends[0].tools is None and "tool calls" not in result.output and "tools:" not in result.output
    results = json.loads((tmp_path / "plain" / "results.json").read_text())
    assert "tools" not in results["benchmarks"]["math500"] and results["config"]["tools"] == []


def tool_run(tmp_path, *sets):
    """A run folder whose config.yaml trained with `sets` (no checkpoint: a run of 0 steps is
    evaluated as its base model)."""
    from meds_cli.engine.config import dump_yaml, load_config

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = load_config(overrides=["model.name=tiny-llama", "task.name=copy", "train.steps=0", *sets])
    dump_yaml(cfg, run_dir / "config.yaml")
    return run_dir


def test_a_run_trained_with_tools_is_evaluated_with_them_unless_tools_none(tmp_path, data_dir, backends):
    run_dir = tool_run(tmp_path, "rollout.tools=[python]", "rollout.max_tool_calls=3", "rollout.tool_time_limit_s=5",
                       "rollout.code_tags=[<run>, </run>]")
    result = invoke(*eval_args(data_dir, tmp_path / "with", run_dir))
    assert result.exit_code == 0, result.output
    tools = backends[-1].tools
    assert (tools.tools, tools.max_tool_calls, tools.tool_time_limit_s, tools.code_tags) == (
        ["python"], 3, 5.0, ["<run>", "</run>"])
    lines = [line for line in result.output.splitlines() if line.startswith("tools:")]
    assert len(lines) == 1 and "the run was trained with them; --tools none evaluates without" in lines[0]
    # an option overrides the run's limit and keeps the rest
    result = invoke(*eval_args(data_dir, tmp_path / "two", run_dir, "--max-tool-calls", "1"))
    assert result.exit_code == 0, result.output
    assert backends[-1].tools.max_tool_calls == 1 and backends[-1].tools.tool_time_limit_s == 5.0
    result = invoke(*eval_args(data_dir, tmp_path / "without", run_dir, "--tools", "none"))
    assert result.exit_code == 0, result.output
    assert backends[-1].tools is None and "tools:" not in result.output


def test_a_run_trained_without_tools_is_evaluated_without(tmp_path, data_dir, backends):
    result = invoke(*eval_args(data_dir, tmp_path / "out", tool_run(tmp_path)))
    assert result.exit_code == 0, result.output
    assert backends[-1].tools is None


def test_samples_drawn_without_tools_are_not_resumed_with_them(tmp_path, data_dir, backends):
    out = tmp_path / "out"
    assert invoke(*eval_args(data_dir, out, "--model", "tiny-llama")).exit_code == 0
    line = one_error_line(invoke(*eval_args(data_dir, out, "--model", "tiny-llama", "--tools", "python")))
    assert "tools=[]" in line and "['python']" in line and "--output" in line


@pytest.mark.parametrize("args, words", [
    (["--tools", "perl"], ["'perl'", "none, python"]),
    (["--tools", "python,perl"], ["'perl'", "none, python"]),
    (["--tools", ","], ["--tools is empty", "none, python"]),
    (["--max-tool-calls", "2"], ["--max-tool-calls", "without tools", "--tools python"]),
    (["--tools", "none", "--tool-output-tokens", "9"], ["--tool-output-tokens", "--tools python"]),
    (["--tools", "python", "--max-tool-calls", "0"], ["--max-tool-calls must be >= 1, got 0"]),
    (["--tools", "python", "--tool-output-tokens", "0"], ["--tool-output-tokens must be >= 1, got 0"]),
])
def test_bad_tool_options_are_one_line(args, words, tmp_path, data_dir, backends):
    line = one_error_line(invoke(*eval_args(data_dir, tmp_path / "out", "--model", "tiny-llama", *args)))
    for word in words:
        assert word in line, line
    assert not backends and not (tmp_path / "out" / "samples.jsonl").exists()  # refused before any model loads


def test_the_tir_config_samples_with_tools_and_qwens_tir_prompt():
    from meds_cli.engine.config import load_config

    cfg = load_config([str(ROOT / "configs" / "qwen_math_tir.yaml")])
    assert cfg.rollout.tools == ["python"] and cfg.rollout.max_tool_calls == 4
    assert cfg.rollout.tool_output_tokens == 512 and cfg.model.name == "Qwen2.5-Math-1.5B-Instruct"
    assert cfg.train.mixed_precision == "bf16" and cfg.task.name == "math" and cfg.algo.name == "dapo"
    # the system prompt is Qwen2.5-Math's TIR prompt, as docs/tools.md quotes it
    assert cfg.task.system_prompt.startswith("Please integrate natural language reasoning with programs")
    assert f"*\"{cfg.task.system_prompt}\"*" in (ROOT / "docs" / "tools.md").read_text().replace("\n", " ")
    result = invoke("train", "-c", ROOT / "configs" / "qwen_math_tir.yaml", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "not downloaded" in result.output and "warning:" not in result.output


# Qwen2.5's chat template, as far as a system turn and one user turn go (ChatML)
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_the_tir_configs_prompt_is_the_system_turn_and_the_bare_question():
    """Qwen2.5-Math's TIR prompt: prompt_style chat_plain puts the question alone in the user turn,
    after the system prompt; chat would append the boxed instruction; without a template the system
    prompt is a line before the question."""
    from benchmarks.prompts import QWEN_BOXED_INSTRUCTION, build_prompt, problem_prompt
    from meds_cli.core.records import Problem
    from meds_cli.engine.config import load_config
    from meds_cli.engine.model_io.tiny import tiny_tokenizer

    cfg = load_config([str(ROOT / "configs" / "qwen_math_tir.yaml")])
    assert cfg.task.prompt_style == "chat_plain"
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = CHATML
    question = "What is 2 + 3?"
    system = cfg.task.system_prompt
    assert build_prompt(question, tokenizer, "chat_plain", system_prompt=system) == (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        f"<|im_start|>assistant\n")
    assert build_prompt(question, tokenizer, "chat", system_prompt=system).endswith(
        f"<|im_start|>user\nWhat is 2 + 3?\n{QWEN_BOXED_INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n")
    assert problem_prompt("math", Problem("p", question, "5"), tokenizer, "chat_plain", system_prompt=system) == \
        build_prompt(question, tokenizer, "chat_plain", system_prompt=system)
    tokenizer.chat_template = None
    assert build_prompt(question, tokenizer, "chat_plain", system_prompt=system) == f"{system}\nWhat is 2 + 3?"

def test_the_hf_backend_samples_with_tools_end_to_end(tmp_path, data_dir):
    """The real path: the tiny model through the hf engine, turn by turn (tool_turns.py). It writes no
    code, so no block runs; every response still carries its tool stats and the report its columns."""
    out = tmp_path / "out"
    result = invoke(*eval_args(data_dir, out, "--model", "tiny-llama", "--tools", "python", "--limit", "2",
                               "--max-new-tokens", "12", "--temperature", "1.0", "--top-p", "1.0"))
    assert result.exit_code == 0, result.output
    scores = json.loads((out / "results.json").read_text())["benchmarks"]["math500"]
    assert scores["tools"]["calls_per_response"] == 0.0 and scores["tools"]["used_share"] == 0.0
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["tools"]["calls"] == 0 and 1 <= r["length"] <= 12 for r in rows)
    assert "tool calls" in result.output


@pytest.mark.slow
@needs_embedded
@pytest.mark.skipif(not (test_eval_cli.DATA / "math500").is_dir(), reason="no shared benchmark data")
def test_embedded_model_evaluates_with_tools(tmp_path):
    out = tmp_path / "smol"
    result = invoke("eval", "--model", "smollm2-135m", "--benchmarks", "math500", "--data-dir", test_eval_cli.DATA,
                    "--limit", "2", "--k", "2", "--max-new-tokens", "128", "--prompt", "chat", "--tools", "python",
                    "--output", out, "-q")
    assert result.exit_code == 0, result.output
    scores = json.loads((out / "results.json").read_text())["benchmarks"]["math500"]
    assert scores["problems"] == 2 and scores["n"] == 2 and set(scores["pass@k"]) == {"1", "2"}
    assert set(scores["tools"]) == {"calls_per_response", "used_share", "errors_per_response",
                                    "timeouts_per_response", "observation_tokens_per_response"}
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all("tools" in r and r["length"] <= 128 for r in rows)
