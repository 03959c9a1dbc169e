"""Prompt templates shared by training tasks and benchmarks."""

QWEN_BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def boxed_prompt(question: str) -> str:
    """The Qwen-Math prompt, as plain text (what base models are trained with)."""
    return f"{question}\n{QWEN_BOXED_INSTRUCTION}"


def build_prompt(question: str, tokenizer, style: str) -> str:
    """'boxed': the plain Qwen-Math prompt; 'chat': the same text as a user turn of the model's
    chat template (falls back to plain when the tokenizer has no template)."""
    text = boxed_prompt(question)
    if style == "chat" and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    if style not in ("boxed", "chat"):
        raise ValueError(f"unknown prompt style '{style}'; accepted: boxed, chat")
    return text
