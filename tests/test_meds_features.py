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
from tests.conftest import needs_embedded, tiny_config


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
    score_rollouts(model, batch, micro_batch_size=3, with_reference=False, wants_hidden_states=algo.forward_needs(4, records_lens=False).hidden_states,
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


def test_reference_answer_index_by_hand():
    from algorithms.meds_features import reference_answer_index

    opening = [1, 2, 3]  # "\\", "boxed", "{"
    texts = {0: "a", 1: "\\", 2: "boxed", 3: "{", 4: "4", 5: "}", 6: "Ġ\\", 7: "{\\", 8: "frac"}
    def index(ids):
        return reference_answer_index(ids, opening, [texts[i] for i in ids])

    assert index([0, 1, 2, 3, 4, 5]) == 4  # the token after the brace
    assert index([1, 2, 3, 0, 1, 2, 3, 4, 5]) == 7  # the last run
    assert index([0, 6, 2, 3, 4]) == 4  # no exact run after a space: a "boxed" token, then the first "{"
    assert index([0, 6, 2, 7, 8, 5]) == 4  # the merged "{\\" holds a "{": y* is the token after it
    assert index([6, 2] + [0] * 9 + [3, 4]) is None  # the brace ten tokens after "boxed": too far
    assert index([6, 2] + [0] * 8 + [3, 4]) == 11  # nine after: found
    assert index([0, 1, 2, 3]) is None  # the brace is the last token: nothing after it
    assert index([0, 4, 5]) is None  # no box at all
    assert reference_answer_index([0, 6, 2, 3, 4], [], ["a", "Ġ\\", "BOXED", "{", "4"]) == 4  # any case


class PieceTokenizer(WordTokenizer):
    """encode and convert_ids_to_tokens as well, for the reference's search of the token ids."""

    def encode(self, text, add_special_tokens=False):
        assert text == "\\boxed{"
        return [self.pieces.index(piece) for piece in ["\\", "boxed", "{"]]

    def convert_ids_to_tokens(self, ids):
        return [self.pieces[i] for i in ids]


def test_anchor_rules_differ_where_the_brace_is_merged_or_spaced():
    tok = PieceTokenizer(["\\", "boxed", "{", "4", "2", "}", " \\", "{\\", "frac", "<eos>", "a"])
    for ids, project, reference in [
        ([0, 1, 2, 3, 4, 5, 9], (3, "boxed"), (3, "boxed")),
        ([10, 6, 1, 2, 3, 4, 5, 9], (4, "boxed"), (4, "boxed")),  # found by the "boxed" token
        ([0, 1, 7, 8, 5, 9], (2, "boxed"), (3, "boxed")),  # project: the "{\\" token; reference: the one after
        ([10, 3, 9], (2, "last"), (2, "last")),
    ]:
        text = tok.decode(ids)
        assert answer_anchor(text, ids, False, tok, "project") == project, text
        assert answer_anchor(text, ids, False, tok, "reference") == reference, text


def test_reference_anchor_on_the_tiny_tokenizer_is_the_token_after_the_brace():
    _, tok = tiny_model_and_tokenizer()
    text = "x\\boxed{5}"
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert answer_anchor(text, ids, False, tok, "reference") == (text.index("5"), "boxed")  # one token a character
    assert answer_anchor(text, ids, False, tok, "project") == (text.index("5"), "boxed")
    assert answer_anchor("x\\boxed{", ids[:8], True, tok, "reference") == (7, "truncated")  # brace last: skipped


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    """SmolLM2's tokenizer, read from the embedded GGUF file (the model itself is not needed)."""
    from transformers import AutoTokenizer

    from meds_cli.engine.model_io.model import embedded_gguf

    gguf = embedded_gguf()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


@needs_embedded
@pytest.mark.slow
@pytest.mark.parametrize("text, anchored, found_by_reference", [
    ("\\boxed{42}", "4", True),
    ("The answer is \\boxed{42}.", "4", False),  # " \\" is one token: no exact run, and "box" "ed" are two
    ("$\\boxed{7}$", "7", False),
    ("\\boxed{\\frac{1}{2}}", "{\\", False),  # the brace merged with the backslash of \frac
    ("\\boxed{}", "{}", False),
])
def test_smollm2_anchor_cases_from_the_reference(smollm2_tokenizer, text, anchored, found_by_reference):
    """The reference code skips the responses where its search of the token ids fails; the project
    rule anchors on the token holding the first character after the brace (issue #23)."""
    tok = smollm2_tokenizer
    ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    j, kind = answer_anchor(text, ids, False, tok, "project")
    assert kind == "boxed" and tok.convert_ids_to_tokens(ids[j]) == anchored
    j, kind = answer_anchor(text, ids, False, tok, "reference")
    assert (kind == "boxed") == found_by_reference
    if found_by_reference:
        assert tok.convert_ids_to_tokens(ids[j]) == anchored
    else:
        assert (j, kind) == (len(ids) - 1, "last")  # unboxed: meds.unboxed skip leaves it out


def test_bfloat16_features_round_as_the_reference_does():
    from algorithms.meds_features import rounded_features

    values = torch.tensor([[3.14159, 1.0 + 2 ** -8, 3.1410, 3.1420, -100.3]])
    # bf16 keeps 8 significant bits: spacing 2^-6 in [2, 4), 2^-7 in [1, 2), 2^-1 in [64, 128)
    # 3.14159 / 2^-6 = 201.06 -> 201 * 2^-6 = 3.140625; 1 + 2^-8 is halfway: to even, 1.0; -100.3 -> -100.5
    assert rounded_features(values, "bfloat16").tolist()[0] == [3.140625, 1.0, 3.140625, 3.140625, -100.5]
    assert torch.equal(rounded_features(values, "float32"), values)


def test_meds_keeps_bfloat16_features_and_the_reference_preset_asks_for_them():
    from pathlib import Path

    from meds_cli.engine.config import load_config
    from tests.test_lens_probe import CharTokenizer

    text = "a\\boxed{7}"
    tokenizer = CharTokenizer(text)
    lens = torch.tensor([[0.0, 0.0]] * 8 + [[3.1410, 3.1420]] + [[0.0, 0.0]])  # y* is "7", token 8
    samples = [[Sample(list(range(len(text))), stopped=True, lens=lens)]]
    batch = rollouts_from_samples(tokenizer, [(0,)], samples, [Problem(id="a", question="q", answer="7")], 1, [])
    algo = build_algorithm(tiny_config("algo.name=meds", "meds.layers=last:2", "meds.feature_dtype=bfloat16"))
    algo.forward_needs(num_layers=4, records_lens=True)
    algo.observe_probe(batch, tokenizer)
    assert batch.extras[FEATURES].tolist() == [[3.140625, 3.140625]]  # two fp32 values, one bf16 number
    configs = Path(__file__).resolve().parent.parent / "configs"
    reference = build_algorithm(load_config([str(configs / "meds_reference.yaml")])).config
    assert (reference.anchor, reference.feature_dtype) == ("reference", "bfloat16")
    assert build_algorithm(tiny_config("algo.name=meds")).config.feature_dtype == "float32"
