"""MEDS memory, clustering and penalty: the pure parts of Memory-Enhanced Dynamic reward Shaping.

Liu et al. 2026, "The past is not past: memory-enhanced dynamic reward shaping" (arXiv 2604.11297),
Method, steps 2-4 (docs/algorithms.md, MEDS):
- a per-prompt memory of past responses' logic features, wrong and correct kept apart, bounded
  (oldest entries dropped first; a bound of 0 keeps everything, as the reference code does) and
  saved with every checkpoint;
- HDBSCAN over the L2-normalised features of memory plus the current responses; |C| of a response
  is the size of its cluster counted over memory and batch (`refit`, the paper), or, as in the
  public reference code (Linxi000/MEDS), a k-NN cosine vote against the previous fit's labels
  that counts memory members only (`knn`). A noise point's |C| is 0, 1 or, as the reference
  counts it, the number of noise points (`noise_size`). When HDBSCAN finds no cluster at all the
  set is one mode and is refitted as one cluster (`hdbscan_labels`, `one_mode`), so that a
  collapsed memory of identical errors is penalised instead of being all noise;
- penalty(|C|) = min(alpha * log(|C| + 1), beta), subtracted from wrong responses' rewards
  (with target `both`, correct rewards are divided by 1 + penalty, as the reference code does).

Everything here works on numpy / torch arrays and plain lists; algorithms/meds.py wires it into
the trainer's hooks.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from algorithms.diversity import l2_normalize

KINDS = ("wrong", "correct")
NOISE = -1


# ---------------------------------------------------------------- penalty and shaping


def cluster_penalty(sizes: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """min(alpha * log(|C| + 1), beta) per response; |C| = 0 (no cluster) gives 0.

    The reference code computes coef * min(log(|C| + 1), 2) with coef 0.1; for alpha >= 0 that is
    min(alpha * log(|C| + 1), 2 * alpha), so (alpha, beta) = (0.1, 0.2) reproduces it and beta != 2
    alpha generalises it (a cap chosen apart from the slope). alpha, beta >= 0 (MEDS checks them)."""
    return torch.clamp(alpha * torch.log(sizes.double() + 1.0), max=beta).float()


def shape_rewards_with_penalty(rewards: torch.Tensor, correct: torch.Tensor, penalty: torch.Tensor,
                               target: str) -> torch.Tensor:
    """r - penalty for wrong responses; with target 'both' also r / (1 + penalty) for correct ones."""
    if target not in ("wrong", "both"):
        raise ValueError(f"unknown target '{target}'; accepted: wrong, both")
    shaped = torch.where(correct, rewards, rewards - penalty)
    if target == "both":
        shaped = torch.where(correct, rewards / (1.0 + penalty), shaped)
    return shaped


# ---------------------------------------------------------------- clustering


def merge_duplicates(points: np.ndarray, distance: float) -> np.ndarray:
    """The rows with every group of rows linked by Euclidean distances <= `distance` (connected
    components) replaced by the group's first row; the input itself when no two rows are that
    close (or distance <= 0: exact duplicates are duplicates already)."""
    if distance <= 0 or len(points) < 2:
        return points
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components
    from scipy.spatial.distance import pdist, squareform

    close = squareform(pdist(points) <= distance)
    if not close.any():
        return points
    _, component = connected_components(csr_matrix(close), directed=False)
    first = {}
    for index, c in enumerate(component.tolist()):
        first.setdefault(c, index)
    return points[[first[c] for c in component.tolist()]]


def hdbscan_labels(points: np.ndarray, min_cluster_size: int = 2, min_samples: int = 1,
                   allow_single_cluster: bool = False, one_mode: bool = False,
                   duplicate_distance: float = 0.0) -> np.ndarray:
    """HDBSCAN labels of the L2-normalised rows (-1 = noise). Sets too small for HDBSCAN to build
    a cluster (fewer than max(min_cluster_size, min_samples + 1) points) are all noise.

    `duplicate_distance` (> 0): normalised rows within this chord distance of each other are made
    identical first (merge_duplicates). HDBSCAN is scale-free: a tight blob of responses that
    differ only by numerical noise has a density structure of its own, which it splits as it
    would split any spread of points; as duplicates they are one point of high multiplicity.

    `one_mode`: when the fit finds no cluster at all, refit with allow_single_cluster. HDBSCAN
    never selects the root of its cluster hierarchy by default, so a set whose hierarchy has no
    split (one mode: e.g. every wrong answer the same, the collapse MEDS exists to punish) comes
    back as all noise. Finding no cluster happens exactly when there is no such split (any split
    into two parts of at least min_cluster_size points yields selectable clusters), so the refit
    changes nothing else. In the refit the root's members are the points that stay in it up to
    its densest level (the duplicates; in a small set of distinct points, the closest pair);
    points that joined it only at a lower density stay noise."""
    n = len(points)
    if n < max(2, min_cluster_size, min_samples + 1):
        return np.full(n, NOISE, dtype=np.int64)
    import hdbscan

    x = merge_duplicates(l2_normalize(points), duplicate_distance)

    def fit(allow: bool) -> np.ndarray:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # hdbscan warns about sklearn deprecations on every fit
            return hdbscan.HDBSCAN(min_cluster_size=min_cluster_size, min_samples=min_samples,
                                   allow_single_cluster=allow).fit_predict(x).astype(np.int64)

    labels = fit(allow_single_cluster)
    if one_mode and not allow_single_cluster and (labels == NOISE).all():
        labels = fit(True)
    return labels


NOISE_RULES = ("zero", "singleton", "count")


def noise_size(rule: str, noise_members: int) -> int:
    """|C| of a noise point: 0 ('zero': no penalty), 1 ('singleton': a cluster of its own), or the
    number of noise points it is counted against ('count': noise is one more label, as the
    reference code counts it)."""
    if rule not in NOISE_RULES:
        raise ValueError(f"unknown noise rule '{rule}'; accepted: {', '.join(NOISE_RULES)}")
    return {"zero": 0, "singleton": 1, "count": noise_members}[rule]


def member_counts(labels: np.ndarray, noise: str = "zero") -> np.ndarray:
    """|C| of every point: how many points share its label; a noise point counts as `noise_size`
    says (with 'count': the number of noise points among `labels`)."""
    labels = np.asarray(labels, dtype=np.int64)
    values, counts = np.unique(labels, return_counts=True)
    size_of = dict(zip(values.tolist(), counts.tolist()))
    size_of[NOISE] = noise_size(noise, size_of.get(NOISE, 0))
    return np.array([size_of[label] for label in labels.tolist()], dtype=np.int64)


def knn_vote(memory: np.ndarray, memory_labels: np.ndarray, queries: np.ndarray, k: int = 3) -> np.ndarray:
    """Label of each query by majority vote of its k nearest memory points under cosine similarity.
    Ties between equally near points go to the older one (lower index); ties in the vote to the
    smallest label (both as numpy's stable argsort and unique order them)."""
    if len(memory) == 0:
        return np.full(len(queries), NOISE, dtype=np.int64)
    sims = l2_normalize(queries) @ l2_normalize(memory).T
    k = min(k, len(memory))
    nearest = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    out = []
    for row in nearest:
        values, counts = np.unique(np.asarray(memory_labels)[row], return_counts=True)
        out.append(int(values[np.argmax(counts)]))
    return np.array(out, dtype=np.int64)


@dataclass
class ClusterSettings:
    min_cluster_size: int = 2
    min_samples: int = 1
    allow_single_cluster: bool = False
    noise: str = "zero"
    assign: str = "refit"
    knn_k: int = 3
    one_mode: bool = True  # HDBSCAN finding no cluster: refit with allow_single_cluster (hdbscan_labels)
    duplicate_distance: float = 0.0  # 0: no merging of near-duplicates (hdbscan_labels)
    # Another clusterer, points -> labels (algorithms/meds_clusterers.py, `meds.clusterer`); None: HDBSCAN.
    # It must pickle (a module-level function, a partial of one, or a class instance) so that the
    # prompts of a step can be clustered in worker processes (algorithms/meds_parallel.py).
    clusterer: Callable[[np.ndarray], np.ndarray] | None = None

    def labels(self, points: np.ndarray) -> np.ndarray:
        if self.clusterer is not None:
            return self.clusterer(points)
        return hdbscan_labels(points, self.min_cluster_size, self.min_samples, self.allow_single_cluster,
                              self.one_mode, self.duplicate_distance)


@dataclass
class Assignment:
    """The clustering of one (prompt, kind) at one step: |C| and label of each current response,
    and the labels the memory will keep once the responses are added (None: refit after adding)."""

    sizes: np.ndarray
    labels: np.ndarray
    fitted_labels: np.ndarray | None
    clusters: int


def assign_clusters(memory: np.ndarray, memory_labels: np.ndarray, batch: np.ndarray,
                    settings: ClusterSettings) -> Assignment:
    """|C| of each row of `batch` against `memory` (features [M, L] and the labels of the last fit)."""
    if settings.assign == "refit":
        # The paper: one HDBSCAN over memory + batch; |C| counts members from both.
        labels = settings.labels(np.concatenate([memory, batch]) if len(memory) else batch)
        counts = member_counts(labels, settings.noise)
        return Assignment(sizes=counts[len(memory):], labels=labels[len(memory):], fitted_labels=labels,
                          clusters=len(set(labels.tolist()) - {NOISE}))
    if settings.assign == "knn":
        # The reference code: vote against the previous fit and count memory members only; the
        # memory is refitted after the batch joins it.
        if len(memory) == 0 or len(memory_labels) != len(memory):
            zeros = np.zeros(len(batch), dtype=np.int64)
            return Assignment(sizes=zeros, labels=np.full(len(batch), NOISE, dtype=np.int64), fitted_labels=None,
                              clusters=0)
        memory_labels = np.asarray(memory_labels, dtype=np.int64)
        labels = knn_vote(memory, memory_labels, batch, settings.knn_k)
        # A vote for noise gets noise_size: with 'count', the number of noise members in memory,
        # exactly as the reference code counts it (noise is one more label there).
        noise = noise_size(settings.noise, int(np.sum(memory_labels == NOISE)))
        counts = np.array([np.sum(memory_labels == label) if label != NOISE else noise for label in labels.tolist()],
                          dtype=np.int64)
        return Assignment(sizes=counts, labels=labels, fitted_labels=None,
                          clusters=len(set(memory_labels.tolist()) - {NOISE}))
    raise ValueError(f"unknown assign mode '{settings.assign}'; accepted: refit, knn")


# ---------------------------------------------------------------- diagnostics


# ---------------------------------------------------------------- the memory


@dataclass
class Bank:
    """The remembered responses of one prompt and one kind (wrong or correct), oldest first."""

    features: torch.Tensor  # [n, L] float32
    answers: list = field(default_factory=list)  # final answer text (bounded) or None
    snippets: list = field(default_factory=list)  # short response text for inspection
    steps: list = field(default_factory=list)  # training step that added the entry
    labels: list = field(default_factory=list)  # labels of the last fit that covered the bank

    @classmethod
    def empty(cls, width: int) -> "Bank":
        return cls(features=torch.zeros(0, width))

    def __len__(self) -> int:
        return self.features.shape[0]

    def extend(self, features: torch.Tensor, answers, snippets, step: int, labels, limit: int) -> None:
        """Append entries; keep the newest `limit` (0: all of them; labels follow their entries)."""
        keep = slice(-limit, None) if limit > 0 else slice(None)
        self.features = torch.cat([self.features, features.float()])[keep]
        self.answers = (self.answers + list(answers))[keep]
        self.snippets = (self.snippets + list(snippets))[keep]
        self.steps = (self.steps + [step] * len(features))[keep]
        self.labels = [int(v) for v in labels][keep] if labels is not None else []

    def state(self) -> dict:
        return {"features": self.features.clone(), "answers": list(self.answers), "snippets": list(self.snippets),
                "steps": list(self.steps), "labels": list(self.labels)}

    @classmethod
    def from_state(cls, state: dict) -> "Bank":
        return cls(features=state["features"].float().clone(), answers=list(state["answers"]),
                   snippets=list(state["snippets"]), steps=list(state["steps"]), labels=list(state["labels"]))


class Memory:
    """Banks keyed by (Problem.id, kind)."""

    def __init__(self):
        self.banks: dict[str, dict[str, Bank]] = {}

    def bank(self, prompt_id: str, kind: str, width: int) -> Bank:
        bank = self.banks.get(prompt_id, {}).get(kind)
        return bank if bank is not None else Bank.empty(width)

    def put(self, prompt_id: str, kind: str, bank: Bank) -> None:
        self.banks.setdefault(prompt_id, {})[kind] = bank

    def entries(self) -> int:
        return sum(len(b) for kinds in self.banks.values() for b in kinds.values())

    def state_dict(self) -> dict:
        # Sorted so that the saved object does not depend on the order prompts were first seen.
        return {pid: {kind: bank.state() for kind, bank in sorted(kinds.items())}
                for pid, kinds in sorted(self.banks.items())}

    def load_state_dict(self, state: dict) -> None:
        self.banks = {pid: {kind: Bank.from_state(b) for kind, b in kinds.items()} for pid, kinds in state.items()}


def snippet(text: str, chars: int) -> str:
    """A bounded excerpt: the whole text when short, else its head and tail (approach and answer)."""
    if len(text) <= chars:
        return text
    half = max(1, (chars - 3) // 2)
    return text[:half] + " … " + text[-half:]


def bounded(text: str | None, chars: int = 64) -> str | None:
    return None if text is None else text[:chars]
