"""A deterministic fake engine for the tool turn loop, and a one-character-per-token tokenizer.

`ScriptedEngine` holds the model text of each response in full (code blocks, prose, the answer);
each call continues a context the way a real engine does: it emits the script's next characters
up to and including the first stop string, or to the end of the script (EOS), or until the
token budget runs out. The sampler's log-prob of the k-th character of script s is
-(s + 1) / 100 - k / 10_000, so a test can tell which token each log-prob belongs to. Every
context it is given is kept (`contexts`), to check what the loop inserted between turns.
"""

from __future__ import annotations

from meds_cli.engine.rollout.tools.turn_loop import Turn


class CharTokenizer:
    """One token per character (its code point): hand-countable token lengths."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(char) for char in text]

    def decode(self, ids) -> str:
        return "".join(chr(i) for i in ids)


def scripted_logprob(script: int, position: int) -> float:
    return -(script + 1) / 100 - position / 10_000


class ScriptedEngine:
    def __init__(self, prompts: list[str], scripts: list[str]):
        self.tokenizer = CharTokenizer()
        self.prompts = [self.tokenizer.encode(p) for p in prompts]
        self.scripts, self.emitted = scripts, [0] * len(scripts)
        self.contexts: list[str] = []  # every context given, decoded
        self.stops: list[list[str]] = []  # the stop strings of every call

    def prompt_ids(self) -> list[list[int]]:
        return [list(p) for p in self.prompts]

    def _script_of(self, context: list[int]) -> int:
        matches = [s for s, prompt in enumerate(self.prompts) if context[: len(prompt)] == prompt]
        assert len(matches) == 1, "each prompt must start one context only"
        return matches[0]

    def __call__(self, contexts, max_new_tokens, stop, seeds=None):
        self.stops.append(list(stop))
        turns = []
        for context, budget in zip(contexts, max_new_tokens, strict=True):
            self.contexts.append(self.tokenizer.decode(context))
            s = self._script_of(context)
            start, script = self.emitted[s], self.scripts[s]
            ends = [script.find(text, start) + len(text) for text in stop if script.find(text, start) >= 0]
            end = min(ends) if ends else len(script)
            finished = end == len(script)
            if end - start > budget:
                end, finished = start + budget, True  # the engine's length limit
            self.emitted[s] = end
            turns.append(Turn(self.tokenizer.encode(script[start:end]),
                              [scripted_logprob(s, k) for k in range(start, end)], finished))
        return turns
