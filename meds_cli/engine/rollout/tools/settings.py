"""The `rollout.tools` settings: which tools a response may call, how often, how long each runs
and how much of its output the model reads back. A config section in the project's form
(core/fields.py): each field's help text and check beside its default; `validate` for the checks
that relate fields. The rollout section inherits it (engine/config.py `RolloutSettings`), so the keys
are rollout.tools, rollout.max_tool_calls, ... (docs/tools.md, "Settings")."""

from __future__ import annotations

from dataclasses import dataclass, fields

from meds_cli.core.fields import at_least, doc, greater_than, require

TOOLS = ("python",)  # the tools a response may call; one today


@dataclass
class ToolSettings:
    tools: list[str] = doc([], f"tools a response may call mid-answer: [] (none) or [python] "
                               f"(accepted: {', '.join(TOOLS)}); docs/tools.md")
    max_tool_calls: int = doc(4, "code blocks run per response; a later block gets an observation saying the "
                                 "limit is reached, and the response must then finish", at_least(1))
    tool_output_tokens: int = doc(512, "tokens of a block's output the model reads back; the rest is cut, "
                                       "with a line saying how many tokens were left out", at_least(1))
    code_tags: list[str] = doc(["<code>", "</code>"], "the opening and closing tag of a code block, beside "
                                                      "Qwen2.5-Math's ```python ... ``` fences")
    tool_time_limit_s: float = doc(10.0, "seconds one block may run (the replay of the response's earlier "
                                         "blocks gets its own allowance on top)", greater_than(0))

    @property
    def enabled(self) -> bool:
        return bool(self.tools)

    def validate(self, prefix: str) -> None:
        require(isinstance(self.tools, list), f"{prefix}tools must be a list such as [python], got {self.tools!r}")
        for tool in self.tools:
            require(tool in TOOLS, f"{prefix}tools has '{tool}'; accepted: {', '.join(TOOLS)}")
        require(len(self.tools) == len(set(self.tools)), f"{prefix}tools names a tool twice: {self.tools}")
        tags_ok = isinstance(self.code_tags, list) and len(self.code_tags) == 2
        require(tags_ok and all(isinstance(tag, str) and tag.strip() for tag in self.code_tags),
                f"{prefix}code_tags must be two non-empty tags [opening, closing], got {self.code_tags}")
        require(self.code_tags[0] != self.code_tags[1],
                f"{prefix}code_tags must differ (the closing tag ends the block), got {self.code_tags}")
        require("```" not in "".join(self.code_tags),
                f"{prefix}code_tags must not contain ``` (fences are the ```python format), got {self.code_tags}")


def tool_settings_of(section) -> ToolSettings:
    """The tool settings of a section that inherits them (the rollout section), as a ToolSettings
    of their own: what the sampling settings carry, without the rest of the section."""
    return ToolSettings(**{f.name: getattr(section, f.name) for f in fields(ToolSettings)})
