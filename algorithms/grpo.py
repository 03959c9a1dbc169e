"""GRPO (Shao et al. 2024, DeepSeekMath): the hooks' defaults in algorithms/base.py, registered."""

from algorithms.base import Algorithm, register


@register("grpo", "GRPO: group-normalised rewards, clipped surrogate, optional k3 KL to the base model")
class GRPO(Algorithm):
    pass
