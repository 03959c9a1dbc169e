"""Prompt templates shared by training tasks and benchmarks."""

from meds_cli.core.records import Problem

QWEN_BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
CODE_INSTRUCTION = "Write your solution in Python in one ```python code block."
STYLES = ("boxed", "chat")


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


def apply_style(text: str, tokenizer, style: str) -> str:
    """'boxed': the text as it is; 'chat': the text as a user turn of the model's chat template
    (plain when the tokenizer has no template)."""
    if style not in STYLES:
        raise ValueError(f"unknown prompt style '{style}'; accepted: {', '.join(STYLES)}")
    if style == "chat" and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return text


def build_prompt(question: str, tokenizer, style: str) -> str:
    """The Qwen-Math boxed prompt for a math question, in the given style."""
    return apply_style(boxed_prompt(question), tokenizer, style)


def problem_prompt(kind: str, problem: Problem, tokenizer, style: str) -> str:
    """The prompt for a problem of a benchmark or task of `kind` ('math' or 'code')."""
    text = code_prompt_text(problem) if kind == "code" else boxed_prompt(problem.question)
    return apply_style(text, tokenizer, style)
