"""GRPO (Shao et al. 2024, DeepSeekMath): the hooks' defaults in algorithms/base.py, registered.

Its advantages come from the estimator named by `grpo.adv_estimator` (algorithms/advantages.py):
group-normalised rewards by default, RLOO or REINFORCE++-baseline by name.
"""

from algorithms.base import Algorithm, register


@register("grpo", "GRPO: group-normalised rewards (or grpo.adv_estimator), clipped surrogate, optional k3 KL "
                  "to the base model")
class GRPO(Algorithm):
    pass
