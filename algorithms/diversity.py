"""How diverse a group of responses is: the pure formulas behind the `diversity/` metrics that
every algorithm logs per step (engine/training/diversity.py), and behind MEDS's own eigen ratio.

Answers (a group = the G responses to one prompt; `labels` are answer classes per response as
algorithms/answer_groups.answer_classes gives them, None where no answer was extracted; `correct`
the grader's verdict per response):
- distinct wrong answers: how many different classes the wrong responses with an answer hold.
  A response without an answer is not an answer: it adds no class (it is still wrong);
- one repeated error: the group's wrong responses with an answer are at least two and all one
  class (the error collapsed to a single mode). Groups with fewer than two such responses have
  no error mode to speak of and are neither counted as one nor as the other.
Representations (Liu et al. 2026, MEDS, arXiv 2604.11297, Figure 5: the top-1 eigen ratio,
high = collapsed):
- top-1 eigen ratio of a set of feature vectors: the largest eigenvalue of their covariance over
  the sum of its eigenvalues, in the L2-normalised space MEDS clusters in. The covariance is
  centred, so the ratio measures the shape of the spread around the mean: 1 when every vector
  is one direction (or all are identical), 1/n when the vectors spread equally along n
  orthogonal directions (e.g. +-e_1, ..., +-e_n). n orthogonal vectors e_1..e_n themselves span,
  around their mean, an (n - 1)-dimensional simplex: 1/(n - 1).
Tokens: the mean of a per-token value (the policy's entropy) over the response tokens of a mask.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np
import torch


def wrong_answer_labels(labels: Sequence[Hashable | None], correct: Sequence[bool]) -> list[Hashable]:
    """The answer classes of the wrong responses that have an answer, in order."""
    return [label for label, ok in zip(labels, correct) if not ok and label is not None]


def distinct_labels(labels: Sequence[Hashable | None], keep: Sequence[bool] | None = None) -> int:
    """How many different answer classes the responses hold (those where `keep` is True; all
    without it); no answer (None) is no class."""
    keep = [True] * len(labels) if keep is None else keep
    return len({label for label, kept in zip(labels, keep) if kept and label is not None})


def distinct_wrong_answers(labels: Sequence[Hashable | None], correct: Sequence[bool]) -> int:
    """How many different answer classes the group's wrong responses hold (no answer: no class)."""
    return distinct_labels(labels, [not ok for ok in correct])


def one_repeated_error(labels: Sequence[Hashable | None], correct: Sequence[bool]) -> bool | None:
    """True: at least two wrong responses with an answer, all the same answer; False: at least two,
    not all the same; None: fewer than two (no error mode to judge)."""
    wrong = wrong_answer_labels(labels, correct)
    if len(wrong) < 2:
        return None
    return len(set(wrong)) == 1


def l2_normalize(points: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (a zero row stays zero); NaN/inf from a broken forward pass become 0."""
    points = np.nan_to_num(np.asarray(points, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    norms = np.linalg.norm(points, axis=1, keepdims=True)
    return points / np.maximum(norms, 1e-12)


def top1_eigen_ratio(points: np.ndarray) -> float | None:
    """Largest eigenvalue of the covariance of the rows divided by the sum of its eigenvalues
    (the paper's Top-1 Eigen Ratio: high = collapsed representations). Identical rows (all
    eigenvalues 0) count as fully collapsed, 1.0; fewer than two rows: None."""
    points = np.asarray(points, dtype=np.float64)
    if len(points) < 2:
        return None
    eig = np.clip(np.linalg.eigvalsh(np.cov(points, rowvar=False).reshape(points.shape[1], points.shape[1])), 0, None)
    total = eig.sum()
    return 1.0 if total <= 1e-12 else float(eig.max() / total)


def mean_group_eigen_ratio(features, groups: Sequence[slice]) -> float | None:
    """The mean over groups of the top-1 eigen ratio of each group's L2-normalised feature rows
    (`features` [B, D], a tensor or an array); None when no group has two rows."""
    points = features.numpy() if isinstance(features, torch.Tensor) else np.asarray(features)
    ratios = [top1_eigen_ratio(l2_normalize(points[rows])) for rows in groups]
    ratios = [r for r in ratios if r is not None]
    return float(np.mean(ratios)) if ratios else None


def masked_token_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """sum(values * mask) / sum(mask) over every token of the batch (0 where the mask is empty)."""
    return ((values * mask).sum() / mask.sum().clamp(min=1)).item()
