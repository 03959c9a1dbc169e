"""Prompt templates shared by training tasks and benchmarks."""

from meds_cli.core.records import Problem

QWEN_BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
CODE_INSTRUCTION = "Write your solution in Python in one ```python code block."
# reasoning-gym's native answer format (task.answer_format answer_tags), asked the way the boxed one is.
ANSWER_TAGS_INSTRUCTION = "Please reason step by step, and put your final answer between <answer> and </answer> tags."
# boxed: the instruction, as plain text; chat: the same in the model's chat template; plain: the
# problem text exactly as written, no instruction and no template (models trained from scratch on
# bare problems, which know no instruction); chat_plain: the problem text alone in the model's chat
# template, after its system prompt (Qwen2.5-Math's TIR: the instruction is the system turn).
STYLES = ("boxed", "chat", "plain", "chat_plain")
TEMPLATED = ("chat", "chat_plain")  # the styles that use the model's chat template
BARE = ("plain", "chat_plain")  # the styles that add no instruction to the problem text


def boxed_prompt(question: str) -> str:
    """The Qwen-Math prompt, as plain text (what base models are trained with)."""
    return f"{question}\n{QWEN_BOXED_INSTRUCTION}"


def code_prompt_text(problem: Problem) -> str:
    """The plain prompt for a code problem: complete the function (HumanEval style) or solve it."""
    answer = problem.answer if isinstance(problem.answer, dict) else {}
    if answer.get("completes_prompt"):
        return f"Complete the following Python function.\n\n```python\n{problem.question}```\n\n{CODE_INSTRUCTION}"
    starter = answer.get("starter_code") or ""
    starter_text = f"\n\nStart from this code:\n```python\n{starter}\n```" if starter.strip() else ""
    return f"{problem.question}{starter_text}\n\n{CODE_INSTRUCTION}"


def apply_style(text: str, tokenizer, style: str, system_prompt: str = "", template_kwargs: dict | None = None) -> str:
    """'boxed' and 'plain': the text as it is; 'chat' and 'chat_plain': the text as a user turn of the
    model's chat template (plain when the tokenizer has no template), after a system turn when `system_prompt` is set,
    with `template_kwargs` passed to the template (e.g. Qwen3's enable_thinking). Without a
    template the system prompt is a line before the text."""
    if style not in STYLES:
        raise ValueError(f"unknown prompt style '{style}'; accepted: {', '.join(STYLES)}")
    if style in TEMPLATED and getattr(tokenizer, "chat_template", None):
        system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        return tokenizer.apply_chat_template(system + [{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True, **(template_kwargs or {}))
    return f"{system_prompt}\n{text}" if system_prompt else text


def build_prompt(question: str, tokenizer, style: str, **options) -> str:
    """The Qwen-Math boxed prompt for a math question, in the given style (options: apply_style's);
    in the plain styles (BARE) the question alone."""
    return apply_style(question if style in BARE else boxed_prompt(question), tokenizer, style, **options)


def answer_tags_prompt(question: str, tokenizer, style: str, **options) -> str:
    """The question with the instruction to answer between <answer> tags, in the given style; in
    the plain styles (BARE) the question alone."""
    text = question if style in BARE else f"{question}\n{ANSWER_TAGS_INSTRUCTION}"
    return apply_style(text, tokenizer, style, **options)


def problem_prompt(kind: str, problem: Problem, tokenizer, style: str, **options) -> str:
    """The prompt for a problem of a benchmark or task of `kind` ('math' or 'code'); in the plain
    styles (BARE) the problem text alone."""
    if style in BARE:
        text = problem.question
    else:
        text = code_prompt_text(problem) if kind == "code" else boxed_prompt(problem.question)
    return apply_style(text, tokenizer, style, **options)
