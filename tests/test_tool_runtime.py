"""Tool-integrated reasoning without an engine (issue 56): code blocks found where they close, the
observation inserted verbatim and cut where it should be, state kept between a response's blocks,
the call limit, hostile blocks contained in one line, the loss mask and the model-token positions,
and the turn loop end to end with a scripted fake engine (tests/scripted_tool_engine.py)."""

from dataclasses import dataclass

import pytest

from benchmarks.sandbox import isolation_mode
from meds_cli.core.errors import UserError
from meds_cli.core.fields import validate_section
from meds_cli.engine.config import build
from meds_cli.engine.rollout.tools import python_session
from meds_cli.engine.rollout.tools.blocks import closed_block, cut_to_tokens, observation_text, stop_strings
from meds_cli.engine.rollout.tools.python_session import PythonSession, run_blocks
from meds_cli.engine.rollout.tools.settings import ToolSettings
from meds_cli.engine.rollout.tools.turn_loop import (
    Segment,
    ToolResponse,
    ToolRuntime,
    Turn,
    TurnLimits,
    response_layout,
    response_logprobs,
    sample_with_tools,
)
from tests.scripted_tool_engine import CharTokenizer, ScriptedEngine, scripted_logprob

TAGS = ("<code>", "</code>")
FAST = ToolSettings(tools=["python"], tool_time_limit_s=2.0)


# ------------------------------------------------------------------ blocks and observations


@pytest.mark.parametrize("text, source", [
    ("Let me compute.\n```python\nx = 2\nprint(x)\n```\n", "x = 2\nprint(x)\n"),
    ("```python\nprint(1)\n```", "print(1)\n"),  # closed at the very end
    ("```python\nprint(1)\n```\n\n  ", "print(1)\n"),  # whitespace of the token after the fence
    ("```python\nprint(1)\n```\n```output", "print(1)\n"),  # a TIR model opens the output itself
    ("```python\na = 1\n```\n```output\n\n```\nthen\n```python\nprint(a)\n```\n", "print(a)\n"),  # two: the last
    ("```python\nprint(1)\n", None),  # unclosed
    ("```python\nprint(1)\n```\nSo the answer is 1.", None),  # prose after the block
    ("```python\nx = 1\n```\n```output\n1\n```\n", None),  # the last fence closes an output block
    ("```\nplain fence\n```\n", None),  # not a python block
    ("Run <code>print(2)</code>", "print(2)"),
    ("<code>\na = 1\n</code> and <code>\nprint(a)\n</code>\n", "print(a)\n"),  # two tagged: the last
    ("<code>print(2)", None),  # unclosed tag
    ("print(2)</code>", None),  # a closing tag alone
])
def test_closed_block_at_the_end(text, source):
    assert closed_block(text, TAGS) == source


def test_stop_strings_pause_at_a_closing_fence_not_an_opening_one():
    stops = stop_strings(TAGS)
    assert "</code>" in stops and "```output" in stops
    assert not any(stop in "Let me see.\n```python\nx = 1" for stop in stops)
    assert any(stop in "```python\nx = 1\n```\n" for stop in stops)


def test_observation_text_is_the_output_verbatim_in_an_output_block():
    output = "3\n  indented [x] ```not a fence\n"
    assert observation_text("```python\nprint(3)\n```\n", output) == "```output\n" + output + "```\n"
    assert observation_text("```python\nprint(3)\n```", "3") == "\n```output\n3\n```\n"
    assert observation_text("...```\n```output", "3\n") == "\n3\n```\n"  # the model opened it
    assert observation_text("...```\n```output\n", "3\n") == "3\n```\n"
    assert observation_text("<code>print()</code>", "") == "\n```output\n\n```\n"


def test_output_is_cut_to_its_token_budget_with_a_visible_marker():
    tokenizer = CharTokenizer()
    assert cut_to_tokens("abc", tokenizer, 3) == "abc"
    assert cut_to_tokens("abcdefgh", tokenizer, 3) == "abc\n[output truncated: 5 more tokens]"


# ------------------------------------------------------------------ layout: ids, mask, positions


def test_layout_masks_observations_and_lists_model_positions():
    segments = [Segment([11, 12, 13], True, [-0.1, -0.2, -0.3]), Segment([90, 91], False),
                Segment([14, 15], True, [-0.4, -0.5])]
    ids, mask, positions = response_layout(segments)
    assert ids == [11, 12, 13, 90, 91, 14, 15]
    assert mask == [1, 1, 1, 0, 0, 1, 1]
    assert positions == [0, 1, 2, 5, 6]
    assert response_logprobs(segments) == [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5]
    assert response_logprobs([Segment([1], True, None)]) is None


# ------------------------------------------------------------------ the Python session


def run_in_session(session, *sources):
    return [run_blocks([(session, source)], workers=1)[0] for source in sources]


def test_state_is_carried_between_blocks_and_earlier_output_is_not_repeated():
    first, second = run_in_session(PythonSession(), "x = 2\nprint('first')", "print(x + 1)")
    assert (first.outcome, first.output) == ("passed", "first\n")
    assert (second.outcome, second.output) == ("passed", "3\n")


def test_random_draws_are_the_same_in_the_replay():
    session = PythonSession()
    first, second = run_in_session(session, "import random\nr = random.random()\nprint(r)", "print(r)")
    assert first.output == second.output


def test_an_exception_keeps_what_was_assigned_before_it():
    session = PythonSession()
    crash, after = run_in_session(session, "y = 5\n1 / 0\ny = 6", "print(y)")
    assert crash.outcome == "ZeroDivisionError" and crash.output == "ZeroDivisionError: division by zero"
    assert after.output == "5\n"


@pytest.mark.parametrize("source, outcome, line", [
    ("print('before')\nwhile True:\n    pass", "Timeout", "before\nTimeoutError: the code ran past its 1 s time limit"),
    ("import sys\nsys.exit(3)", "SystemExit", "SystemExit: 3"),
    ("x = bytearray(20 * 1024**3)", "MemoryLimit", "MemoryError: the code ran past its 512 MB memory limit"),
    ("raise ValueError('bad\\nvalue')", "ValueError", "ValueError: bad"),  # a message of two lines: the first
    ("import os\nos._exit(0)", "passed", ""),
])
def test_hostile_blocks_end_in_one_line_and_the_session_goes_on(source, outcome, line):
    session = PythonSession(time_limit_s=1.0, memory_mb=512)
    session_blocks = ["z = 1"]
    run_in_session(session, *session_blocks)
    hostile, after = run_in_session(session, source, "print(z)")
    assert (hostile.outcome, hostile.output) == (outcome, line)
    assert (after.outcome, after.output) == ("passed", "1\n")
    # A block that raised (MemoryError included) is kept, as a notebook cell; one whose process died is dropped.
    assert len(session.blocks) == 2 + (outcome in ("SystemExit", "ValueError", "MemoryLimit"))


def test_a_block_that_ended_its_process_is_not_replayed():
    session = PythonSession(time_limit_s=1.0)
    _, after = run_in_session(session, "w = 1\nwhile True:\n    pass", "print(w)")
    assert after.output == "NameError: name 'w' is not defined"


@pytest.mark.skipif(isolation_mode() != "netns", reason="needs root + unshare/setpriv (process limit per uid)")
def test_a_fork_bomb_is_contained():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    hostile, after = run_in_session(PythonSession(time_limit_s=1.0), bomb, "print('alive')")
    assert hostile.output == "TimeoutError: the code ran past its 1 s time limit"
    assert after.output == "alive\n"


@pytest.mark.skipif(isolation_mode() != "netns", reason="needs root + unshare/setpriv (namespaces, uid switch)")
@pytest.mark.parametrize("source", [
    "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)",
    "open('/root/meds-tool-escape', 'w').write('x')",
])
def test_no_network_and_no_file_outside_the_work_folder(source):
    [result] = run_in_session(PythonSession(time_limit_s=2.0), source)
    assert result.failed and not result.timed_out and "\n" not in result.output
    assert result.output.split(":")[0] in ("OSError", "ConnectionRefusedError", "PermissionError")


def test_blocks_of_several_responses_run_in_one_parallel_pool(monkeypatch):
    batches = []
    real = python_session.run_many

    def recording(jobs, workers=None):
        batches.append((len(jobs), workers))
        return real(jobs, workers=workers)

    monkeypatch.setattr(python_session, "run_many", recording)
    sessions = [PythonSession() for _ in range(3)]
    run_blocks([(s, f"v = {i}") for i, s in enumerate(sessions)], workers=3)
    results = run_blocks([(s, "print(v * 10)") for s in sessions], workers=3)
    assert batches == [(3, 3), (3, 3)]
    assert [r.output for r in results] == ["0\n", "10\n", "20\n"]  # each its own state, in order


# ------------------------------------------------------------------ the turn loop with a fake engine

PROMPT = "Q: what is 6 * 7?\n"
SCRIPT = "Compute it.\n```python\nx = 6 * 7\nprint(x)\n```\nSo the answer is \\boxed{42}."


def run_loop(prompts, scripts, settings=FAST, max_new_tokens=400, workers=2):
    engine = ScriptedEngine(prompts, scripts)
    runtime = ToolRuntime(engine.tokenizer, settings, workers=workers)
    responses = sample_with_tools(engine, engine.prompt_ids(), runtime, TurnLimits.of(settings, max_new_tokens))
    return engine, responses


def test_the_loop_runs_a_block_inserts_its_output_and_samples_on():
    engine, [response] = run_loop([PROMPT], [SCRIPT])
    observation = "```output\n42\n```\n"
    model_1, model_2 = SCRIPT.split("So the")[0], "So the" + SCRIPT.split("So the")[1]
    text = engine.tokenizer.decode(response.layout()[0])
    assert text == model_1 + observation + model_2
    assert engine.contexts == [PROMPT, PROMPT + model_1 + observation]  # verbatim in the next turn's context
    ids, mask, positions = response.layout()
    assert mask == [1] * len(model_1) + [0] * len(observation) + [1] * len(model_2)
    assert [ids[p] for p in positions] == engine.tokenizer.encode(SCRIPT)  # the model's tokens, in order
    logprobs = response.logprobs()
    assert [logprobs[p] for p in positions] == [scripted_logprob(0, k) for k in range(len(SCRIPT))]
    assert response.finished
    stats = response.stats
    assert (stats.calls, stats.errors, stats.timeouts, stats.observation_tokens) == (1, 0, 0, len(observation))
    assert stats.tool_seconds > 0


def test_the_worked_example_of_the_docs():
    model_1 = "Let's compute it directly.\n```python\ntotal = sum(k**2 for k in range(1, 21))\nprint(total)\n```\n"
    model_2 = "The sum of the squares of the first 20 positive integers is \\boxed{2870}."
    engine, [response] = run_loop([PROMPT], [model_1 + model_2])
    assert engine.tokenizer.decode(response.layout()[0]) == model_1 + "```output\n2870\n```\n" + model_2


def test_a_long_output_is_cut_in_the_observation():
    script = "```python\nprint('a' * 50)\n```\nDone."
    settings = ToolSettings(tools=["python"], tool_output_tokens=10)
    engine, [response] = run_loop([PROMPT], [script], settings)
    text = engine.tokenizer.decode(response.layout()[0])
    assert "```output\naaaaaaaaaa\n[output truncated: 41 more tokens]\n```\nDone." in text  # 50 a's and a newline


def test_the_call_limit_stops_running_blocks_and_the_response_finishes():
    block = "```python\nprint({})\n```\n"
    script = block.format(1) + block.format(2) + block.format(3) + "The end."
    settings = ToolSettings(tools=["python"], max_tool_calls=2)
    engine, [response] = run_loop([PROMPT], [script], settings)
    text = engine.tokenizer.decode(response.layout()[0])
    assert "```output\n1\n```\n" in text and "```output\n2\n```\n" in text and "```output\n3\n" not in text
    assert "the limit of 2 code runs per answer is reached" in text
    assert text.endswith("The end.") and response.finished
    assert (response.stats.calls, response.stats.over_limit) == (2, 1)
    assert engine.stops[-1] == []  # after the note the engine samples to the end, pausing nowhere


@pytest.mark.parametrize("hostile, line", [
    ("while True:\n    pass", "TimeoutError: the code ran past its 2 s time limit"),
    ("1/0", "ZeroDivisionError: division by zero"),
    ("import os\nos._exit(1)", "SystemExit: 1"),
])
def test_a_hostile_block_written_by_the_model_is_contained_and_the_rollout_goes_on(hostile, line):
    script = f"```python\n{hostile}\n```\nThe code failed; the answer is \\boxed{{1}}."
    engine, [response] = run_loop([PROMPT], [script])
    text = engine.tokenizer.decode(response.layout()[0])
    assert f"```output\n{line}\n```\nThe code failed" in text and response.finished
    assert response.stats.timeouts + response.stats.errors == 1


def test_several_responses_go_through_the_loop_together():
    prompts = [f"Q{i}: " for i in range(3)]
    scripts = [f"<code>n = {i}</code>then<code>print(n + 100)</code>answer {i}" for i in range(3)]
    scripts.append("no tools here, just an answer")
    engine, responses = run_loop([*prompts, "Q3: "], scripts, workers=3)
    for i, response in enumerate(responses[:3]):
        text = engine.tokenizer.decode(response.layout()[0])
        assert text == (f"<code>n = {i}</code>\n```output\n\n```\nthen<code>print(n + 100)</code>"
                        f"\n```output\n{100 + i}\n```\nanswer {i}")
        assert response.stats.calls == 2
    assert engine.tokenizer.decode(responses[3].layout()[0]) == scripts[3] and responses[3].stats.calls == 0


def test_a_pause_at_a_fence_that_closes_no_code_block_samples_on():
    script = "A table:\n```\n1 2\n```\nand the answer 3."
    engine, [response] = run_loop([PROMPT], [script])
    assert engine.tokenizer.decode(response.layout()[0]) == script and set(response.layout()[1]) == {1}
    assert len(engine.contexts) == 3 and response.stats.calls == 0  # paused at both fences, ran nothing


def test_the_token_budget_counts_observations_and_ends_the_response():
    budget = len("Compute it.\n```python\nx = 6 * 7\nprint(x)\n```\n") + 5
    engine, [response] = run_loop([PROMPT], [SCRIPT], max_new_tokens=budget)
    ids, mask, _ = response.layout()
    assert len(ids) == budget and mask[-5:] == [0] * 5  # the observation cut at the budget
    assert not response.finished and len(engine.contexts) == 1


# ------------------------------------------------------------------ settings


@pytest.mark.parametrize("changes, message", [
    ({"tools": ["bash"]}, "tools.tools has 'bash'; accepted: python"),
    ({"tools": "python"}, "tools.tools must be a list such as [python], got 'python'"),
    ({"max_tool_calls": 0}, "tools.max_tool_calls must be at least 1, got 0"),
    ({"tool_output_tokens": 0}, "tools.tool_output_tokens must be at least 1, got 0"),
    ({"tool_time_limit_s": 0}, "tools.tool_time_limit_s must be greater than 0, got 0"),
    ({"code_tags": ["<code>"]}, "tools.code_tags must be two non-empty tags"),
    ({"code_tags": ["<c>", "<c>"]}, "tools.code_tags must differ"),
])
def test_bad_settings_end_in_one_line(changes, message):
    with pytest.raises(UserError) as error:
        validate_section(ToolSettings(**changes), "tools.")
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_default_settings_are_valid_and_off():
    settings = ToolSettings()
    validate_section(settings, "rollout.tools.")
    assert not settings.enabled and settings.tools == []


def test_settings_plug_into_the_rollout_section_as_a_base_class():
    @dataclass
    class Rollout(ToolSettings):  # how engine/config.py's RolloutConfig takes the fields (docs/tools.md)
        max_new_tokens: int = 64

    section = build(Rollout, {"tools": ["python"], "max_tool_calls": 2, "max_new_tokens": 128}, "rollout.")
    validate_section(section, "rollout.")
    assert section.enabled and TurnLimits.of(section, section.max_new_tokens) == TurnLimits(128, 2, 512)
    with pytest.raises(UserError, match="config key 'rollout.tools' has value 'python'; expected a list of str"):
        build(Rollout, {"tools": "python"}, "rollout.")


def test_a_response_ended_on_a_stop_id_only_where_its_last_model_turn_finished_on_one():
    def response(*segments, finished=True):
        out = ToolResponse(finished=finished)
        for ids, from_model in segments:
            if from_model:
                out.add_model(Turn(ids))
            else:
                out.add_observation(ids)
        return out

    stop = {9}
    assert response(([1, 2, 9], True)).ended_on(stop)
    assert not response(([1, 2, 9], True), finished=False).ended_on(stop)  # paused, then cut by the loop
    assert not response(([1, 2], True)).ended_on(stop)  # the token budget
    assert not response(([1, 9], True), ([5, 9], False)).ended_on(stop)  # an observation filled the budget
    assert not response(([1, 9], True), ([5], False), ([], True)).ended_on(stop)  # a last turn with no token
    assert response(([1], True), ([5], False), ([2, 9], True)).ended_on(stop)
