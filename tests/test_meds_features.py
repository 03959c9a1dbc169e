"""MEDS logic features (algorithms/meds_features.py and MEDS.observe_forward) on the tiny model."""

import pytest
import torch

from meds_cli.engine.training.algorithm_setup import build_algorithm
from algorithms.meds import ANCHOR_INDEX, ANCHOR_KIND, FEATURES
from algorithms.meds_features import answer_anchor, char_to_token, resolve_layers
from meds_cli.core.records import Problem
from meds_cli.core.errors import UserError
from meds_cli.engine.rollout.batch import rollouts_from_samples
from meds_cli.engine.rollout.sampling_engine import Sample
from meds_cli.engine.training.scoring import score_rollouts
from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
from tests.conftest import tiny_config


def test_layer_specs():
    assert resolve_layers("last_half", 28) == list(range(15, 29))  # 14 numbers: the paper's MEDS-14
    assert resolve_layers("last_half", 4) == [3, 4]
    assert resolve_layers("last_half", 1) == [1]
    assert resolve_layers("last:3", 4) == [2, 3, 4]
    assert resolve_layers([0, 2, -1], 4) == [0, 2, 4]
    for bad in ["half", "last:0", "last:x", [], [1.5]]:
        with pytest.raises(UserError):
            resolve_layers(bad, 4)
    with pytest.warns(UserWarning, match="more layers than the model has \\(4\\); using all 4"):
        assert resolve_layers("last:14", 4) == [1, 2, 3, 4]  # the reference keeps every layer it has
    with pytest.raises(UserError, match="0..4"):
        resolve_layers([5], 4)


class WordTokenizer:
    """Multi-character tokens, to check the char -> token mapping beyond a char-level vocabulary."""

    def __init__(self, pieces):
        self.pieces = pieces

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.pieces[i] for i in ids if self.pieces[i] != "<eos>")


def test_char_to_token_with_merged_tokens():
    tok = WordTokenizer(["The", " answer", " is", " \\boxed{", "42", "}", "<eos>", "\\boxed{4", "2}"])
    ids = [0, 1, 2, 3, 4, 5, 6]
    text = tok.decode(ids)
    start = text.index("42")
    assert char_to_token(tok, ids, start) == 4
    assert char_to_token(tok, ids, len(text)) is None
    # the brace and the first digit in one token: y* is that token
    ids = [0, 7, 8, 6]
    assert answer_anchor(tok.decode(ids), ids, False, tok) == (1, "boxed")


class LeadingSpaceTokenizer(WordTokenizer):
    """Decodes like SentencePiece: the leading space of a decoded sequence is dropped, so the decode
    of a suffix is not a suffix of the whole decode (the fast path must notice and fall back)."""

    def decode(self, ids, skip_special_tokens=True):
        return super().decode(ids).removeprefix(" ")


def prefix_definition(tok, ids, offset):
    """The definition: the smallest k with len(decode(ids[:k])) > offset, minus one."""
    for k in range(1, len(ids) + 1):
        if len(tok.decode(ids[:k])) > offset:
            return k - 1
    return None


@pytest.mark.parametrize("tokenizer_class", [WordTokenizer, LeadingSpaceTokenizer])
def test_char_to_token_agrees_with_the_definition_at_every_offset(tokenizer_class):
    tok = tokenizer_class([" The", " answer", " is", " \\boxed{", " 4", "2", "}", " ok", "<eos>"])
    ids = [0, 1, 2, 3, 4, 5, 6, 7, 8]
    text = tok.decode(ids)
    for offset in range(len(text) + 2):
        assert char_to_token(tok, ids, offset, text) == prefix_definition(tok, ids, offset), offset


def test_anchor_kinds():
    tok = WordTokenizer(["a", "b", "\\boxed{", "7", "}", "<eos>"])
    assert answer_anchor("ab", [0, 1, 5], False, tok) == (2, "last")  # no box: the EOS
    assert answer_anchor("ab", [0, 1], True, tok) == (1, "truncated")  # cut: the last generated token
    assert answer_anchor("a\\boxed{7", [0, 2, 3], True, tok) == (2, "boxed")  # cut inside the box
    assert answer_anchor("a\\boxed{", [0, 2], True, tok) == (1, "truncated")  # cut right after the brace
    assert answer_anchor("", [5], False, tok) == (0, "last")  # only an EOS


PROMPTS = ["3=", "12+30="]  # different lengths: the first is left-padded
RESPONSES = [("x\\boxed{5}", True), ("ab", True), ("q\\boxed{17", False), ("zz", False)]  # (text, ends with EOS)


def tiny_batch():
    """Four responses, two per prompt, laid out exactly as sampling lays them out."""
    model, tok = tiny_model_and_tokenizer()
    prompt_ids = [tuple(tok(p, add_special_tokens=False)["input_ids"]) for p in PROMPTS]
    samples = [Sample(tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else []), eos)
               for text, eos in RESPONSES]
    problems = [Problem(id=f"p{i}", question=p, answer="5") for i, p in enumerate(PROMPTS)]
    batch = rollouts_from_samples(tok, prompt_ids, [samples[:2], samples[2:]], problems, 2, [tok.eos_token_id])
    return model, tok, batch


def own_logits(model, tok, prompt, response_ids):
    """The model's logits and hidden states on one unpadded sequence."""
    ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"] + response_ids])
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    return out.logits[0], out.hidden_states, len(ids[0]) - len(response_ids)


@pytest.mark.parametrize("final_norm", [True, False])
def test_features_match_the_model_on_unpadded_sequences(final_norm):
    model, tok, batch = tiny_batch()
    assert batch.attention_mask[0, 0] == 0  # the short prompt really is left-padded
    algo = build_algorithm(tiny_config("algo.name=meds", "meds.layers=last:4", f"meds.final_norm={str(final_norm).lower()}"))
    score_rollouts(model, batch, micro_batch_size=3, with_reference=False, wants_hidden_states=algo.wants_hidden_states,
                   observe=lambda view: algo.observe_forward(batch, view), tokenizer=tok)
    feats, index, kinds = batch.extras[FEATURES], batch.extras[ANCHOR_INDEX], batch.extras[ANCHOR_KIND]
    assert feats.shape == (4, 4)
    # y*: the '5' after \boxed{ (index 8 of 'x\boxed{5}'), the EOS of 'ab', the '1' of the cut
    # 'q\boxed{17', the last 'z' of the cut 'zz'
    assert index.tolist() == [8, 2, 8, 1]
    assert kinds == ["boxed", "last", "boxed", "truncated"]
    norm = model.model.norm
    for i, (text, eos) in enumerate(RESPONSES):
        n = int(batch.response_mask[i].sum())
        response_ids = batch.response_ids[i, :n].tolist()
        logits, hidden, prompt_len = own_logits(model, tok, PROMPTS[i // 2], response_ids)
        j = index[i].item()
        column, token = prompt_len + j - 1, response_ids[j]
        # the last layer is exactly the model's own logit of y* (transformers normalises it already)
        assert feats[i, -1].item() == pytest.approx(logits[column, token].item(), abs=1e-5)
        for k, layer in enumerate([1, 2, 3]):
            h = hidden[layer][0, column]
            h = norm(h) if final_norm else h
            assert feats[i, k].item() == pytest.approx(model.lm_head(h)[token].item(), abs=1e-5)
