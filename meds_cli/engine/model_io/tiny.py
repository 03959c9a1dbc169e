"""A tiny Llama with a character-level tokenizer, built in memory in a second.

Used by the tests and by `--model tiny-llama` smoke runs: the same code path as a real model
(generate, LoRA, logit lens) at a cost of milliseconds per step.
"""

import torch

# dict.fromkeys keeps the order and drops repeats, so every character has exactly one id.
CHARS = list(dict.fromkeys(list("0123456789+-*/=() ") + ["\\", "{", "}"] + list("boxedabcfghijklmnpqrstuvwyz.,:?")))
SPECIALS = ["<pad>", "<eos>"]


def tiny_tokenizer(chars: list[str] = CHARS):
    """A character-level tokenizer over `chars` (one token each), after the pad and EOS tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(chars))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>")
    tokenizer.padding_side = "left"
    return tokenizer


def tiny_model_and_tokenizer(layers: int = 4, hidden: int = 64, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
        tie_word_embeddings=False,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # the same weights every time, whatever the caller's RNG
    model = LlamaForCausalLM(config)
    torch.random.set_rng_state(generator_state)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer
