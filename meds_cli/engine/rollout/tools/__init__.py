"""Tool-integrated reasoning: responses in which the model runs Python mid-answer (issue 56).

A response with tool calls is a sequence of model turns and observations. The turn loop sits
beside the engines, not inside one: an engine samples a turn until a code block closes (a stop
string), the sandbox runs the block, the loop appends the output as an observation, and the
engine samples on. Observations are context, not policy: the loss mask is 0 on them.

  settings.py        the `rollout.tools` settings and their checks
  blocks.py          a closed code block at the end of the text, stop strings, observation text
  python_session.py  one response's notebook-like Python session in the sandbox; many at once
  turn_loop.py       `sample_with_tools`, the token layout (ids, loss mask, model positions), stats

Part of the rollout room; imports the sandbox (benchmarks) and the core only. The engines are
driven through it by engine/rollout/tool_turns.py (docs/tools.md, "The engines").
"""
