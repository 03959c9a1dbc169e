"""The hooks every algorithm provides, with GRPO's behaviour as the defaults.

The trainer runs, for every step:
  sample -> observe_forward (sampling forward pass) -> reward_components -> keep_groups
  (repeat sampling up to generation_rounds) -> observe_probe (values recorded while sampling,
  where the engine records them) -> shape_rewards -> compute_advantages
  -> token_loss + aggregation (every mini-batch, every PPO epoch) -> on_step_end
and never asks which algorithm it runs. An algorithm is a class registered in ALGORITHMS with
its own config dataclass (its YAML section). Shaping methods (MEDS, EDAS) wrap a base
algorithm with `OnBase` and change only the hooks they need.

An algorithm sees its own config section and an `AlgorithmContext` (reward values, the length
limit, the task's answer reader, a gather over the run's processes), never the whole run config:
it cannot come to depend on another algorithm's keys or on which task runs.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from algorithms.advantages import ADV_ESTIMATORS
from algorithms.policy_loss import LOSS_AGG_MODES, POLICY_LOSSES, add_entropy_bonus, add_kl_penalty
from meds_cli.core.errors import UserError
from meds_cli.core.fields import Check, at_least, choice, doc, greater_than, require
from meds_cli.core.forward import ForwardNeeds, ForwardView
from meds_cli.core.records import CORRECTNESS
from meds_cli.core.registry import Registry
from meds_cli.core.rollouts import Rollouts

ALGORITHMS: Registry = Registry("algorithm")


def register(name: str, description: str):
    """Class decorator: register an algorithm under `name` and remember the name on the class."""

    def add(cls):
        cls.name = name
        cls.description = description
        return ALGORITHMS.register(name, description)(cls)

    return add


@dataclass
class GRPOConfig:
    adv_estimator: str = choice("grpo", ADV_ESTIMATORS.names(), "advantage estimator (algorithms/advantages.py)")
    scale_rewards: str = choice("group", ["group", "batch", "none"],
                                "divide advantages by the group std, the batch std, or nothing")
    adv_eps: float = doc(1e-6, "epsilon in the advantage denominator", greater_than(0))
    clip_low: float = doc(0.2, "eps_low: ratio clipped below at 1 - eps_low", Check(lambda v: 0 <= v < 1, "in [0, 1)"))
    clip_high: float = doc(0.2, "eps_high: ratio clipped above at 1 + eps_high", at_least(0))
    dual_clip: bool = doc(False, "dual clip for negative advantages")
    clip_ratio_c: float = doc(3.0, "dual-clip bound c (> 1)", greater_than(1))
    loss_agg: str = choice("seq-mean-token-mean", LOSS_AGG_MODES, "loss aggregation")
    kl_coef: float = doc(0.0, "weight of the k3 KL to the reference policy (adapter disabled)", at_least(0))
    policy_loss: str = choice("vanilla", POLICY_LOSSES.names(), "per-token policy loss (algorithms/policy_loss.py)")
    kl_cov_ratio: float = doc(0.0002,
                              "kl-cov: share of tokens penalised (reference code 0.0002; the RLIF seed reports 0.02)",
                              Check(lambda v: 0 <= v <= 1, "in [0, 1]"))
    kl_cov_coef: float = doc(1.0, "kl-cov: weight of |logp - old_logp| on the selected tokens", at_least(0))
    clip_cov_ratio: float = doc(0.0002, "clip-cov: share of tokens whose gradient is cut (reference code 0.0002)",
                                Check(lambda v: 0 < v <= 1, "in (0, 1]"))
    clip_cov_lb: float = doc(1.0, "clip-cov: a token is a candidate when clip_cov_lb < cov < clip_cov_ub")
    clip_cov_ub: float = doc(5.0, "clip-cov: upper covariance bound of a candidate")
    passk_k: int = doc(4, "passk estimator: the k of pass@k (at most rollout.group_size)", at_least(1))
    entropy_coef: float = doc(0.0, "entropy bonus: loss - entropy_coef * entropy per token (0: none)", at_least(0))

    def validate(self, prefix: str) -> None:
        require(self.adv_estimator == "grpo" or self.scale_rewards == "group",
                f"{prefix}scale_rewards={self.scale_rewards} applies to {prefix}adv_estimator=grpo only, "
                f"not {self.adv_estimator}")
        require(self.clip_cov_lb < self.clip_cov_ub,
                f"{prefix}clip_cov_lb={self.clip_cov_lb} must be below {prefix}clip_cov_ub={self.clip_cov_ub}")


def one_process(value) -> list:
    """The gather of a run of one process: its own value."""
    return [value]


@dataclass(frozen=True)
class AlgorithmContext:
    """What an algorithm may know of the run besides its own config section; the engine builds it
    (meds_cli/engine/training/algorithm_setup.py)."""

    reward_correct: float  # reward of a correct response
    reward_wrong: float  # reward of a wrong one
    max_new_tokens: int  # response length limit
    read_answer: Callable[[str], str | None]  # the task's reading of a response's final answer (no gold)
    answer_mode: str  # the name of that reading (boxed, first_char, ...), for logs
    optimizer_steps_per_batch: int  # PPO epochs x mini-batches: 1 means the policy ratio stays 1
    # (name, weight) of the user's reward channels (reward.functions), which sit in
    # rollouts.reward_components beside the algorithm's own, already multiplied by their weight.
    extra_reward_channels: tuple[tuple[str, float], ...] = ()
    # rollout.temperature: responses are drawn from softmax(logits / T), the distribution whose
    # log-probs the loss uses (algorithms.md, notation).
    sampling_temperature: float = 1.0
    # gather(value) -> [value of process 0, value of process 1, ...]: a collective every process
    # enters, from the same hook at the same step (shape_rewards and compute_advantages run on
    # every process at every step that trains); values are picklable. One process: [value].
    gather: Callable[[Any], list] = one_process


class Algorithm:
    """GRPO: group-normalised outcome rewards and the clipped surrogate (algorithms.md, GRPO)."""

    name = "base"
    description = ""
    config_class: type = GRPOConfig
    composes = False  # True for shaping methods that wrap a base algorithm
    default_base = "dapo"  # a shaping method's algo.base when the config leaves it empty
    # Rewards are normalised within each group of responses to a prompt: a group of one has no
    # baseline, so rollout.group_size must be at least this (checked when the config loads).
    min_group_size = 2

    def __init__(self, config, context: AlgorithmContext):
        self.config = config
        self.context = context
        if not self.composes:  # a shaping method's loss is its base's
            self.policy_loss = POLICY_LOSSES.get(config.policy_loss)
            if (config.policy_loss == "kl-cov" and context.optimizer_steps_per_batch == 1
                    and config.kl_cov_ratio > 0 and config.kl_cov_coef != 0):
                warnings.warn(f"{self.name}: with train.ppo_epochs=1 and one mini-batch the policy ratio is exactly 1, "
                              "so the KL-Cov penalty |logp - old_logp| is zero; set train.ppo_epochs>1 or "
                              "train.mini_batch_size below the batch to make it act", UserWarning, stacklevel=3)

    @classmethod
    def key_settings(cls, own) -> dict[str, Any]:
        """The settings of its config section `own` that say what this arm runs (`meds ablate`
        shows them beside the arm's name); default: none."""
        return {}

    @classmethod
    def check_settings(cls, sections: Mapping[str, Any], base: str, group_size: int) -> None:
        """Checks across config sections, run when the config loads (meds_cli/engine/config.py);
        `sections` maps algorithm names to their sections, `base` is algo.base. Default: the
        passk estimator's k fits in a group."""
        own = sections[cls.name]
        if getattr(own, "adv_estimator", None) == "passk":
            require(own.passk_k <= group_size, f"{cls.name}.passk_k={own.passk_k} must be at most "
                                               f"rollout.group_size={group_size} (pass@k of a group of G needs k <= G)")

    # -- forwards other than the update's: one declaration, two receivers
    def forward_needs(self, num_layers: int, records_lens: bool) -> ForwardNeeds:
        """What this algorithm reads besides the update's forward (core/forward.py ForwardNeeds),
        asked once before the first step: `num_layers` is the model's decoder layer count,
        `records_lens` whether the rollout engine can record logit-lens values while it samples.
        Default: nothing, or, for a class that overrides observe_forward without declaring when
        it reads it, the earliest stage (the safe guess)."""
        return ForwardNeeds(view="rewards" if type(self).observe_forward is not Algorithm.observe_forward else None)

    def observe_forward(self, rollouts: Rollouts, view: ForwardView) -> None:
        """See the logits (and hidden states if declared) of the no-grad scoring pass."""

    def observe_probe(self, rollouts: Rollouts, tokenizer) -> None:
        """See the values the engine recorded (rollouts.sampler_lens, asked in forward_needs) for
        the groups that train, before shape_rewards."""

    @property
    def uses_reference(self) -> bool:
        return self.config.kl_coef > 0

    # -- rewards
    def reward_components(self, rollouts: Rollouts) -> dict[str, torch.Tensor]:
        """Named reward channels [B]; their sum is the reward. Default: graded correctness,
        wrong + credit * (correct - wrong), where credit is 1/0 or a task's partial credit
        (verdict.detail['credit'], e.g. the share of unit tests passed)."""
        credit = torch.tensor([float(v.detail.get("credit", v.correct)) for v in rollouts.verdicts])
        ctx = self.context
        return {CORRECTNESS: ctx.reward_wrong + credit * (ctx.reward_correct - ctx.reward_wrong)}

    def generation_rounds(self) -> int:
        """How many sampling rounds a step may use to fill its batch with kept groups."""
        return 1

    def short_batch_hint(self) -> str:
        """What the user can change when the sampling rounds kept fewer groups than a step needs
        (the trainer's warning ends with it); '' when there is nothing to say."""
        return ""

    def keep_groups(self, rollouts: Rollouts) -> torch.Tensor:
        """[P] bool: which groups train. Default: all."""
        return torch.ones(rollouts.num_groups, dtype=torch.bool)

    def shape_rewards(self, rollouts: Rollouts) -> None:
        """Change rollouts.rewards in place before advantages. Default: nothing."""

    # -- advantages and loss
    def compute_advantages(self, rollouts: Rollouts) -> torch.Tensor:
        estimate = ADV_ESTIMATORS.get(self.config.adv_estimator)
        return estimate(rollouts.rewards, rollouts.group_size, rollouts.response_lengths, self.config)

    def loss_mask(self, rollouts: Rollouts) -> torch.Tensor:
        """[B, R] tokens that enter the loss. Default: every response token."""
        return rollouts.response_mask

    @property
    def loss_agg(self) -> str:
        return self.config.loss_agg

    @property
    def entropy_coef(self) -> float:
        """Weight of the entropy bonus; above 0 the update hands token_loss the policy's entropy
        with its gradient."""
        return getattr(self.config, "entropy_coef", 0.0)

    def token_loss(self, logp, old_logp, advantages, mask, ref_logp=None, pg_weights=None, entropy=None):
        """Per-token loss [b, R] and stats for one micro-batch: the configured policy loss, plus the
        k3 KL to the reference policy when this algorithm uses one (the only place it is added),
        minus entropy_coef * entropy when `entropy` [b, R] is given (the entropy bonus; verl's
        entropy_coeff: aggregation is linear, so subtracting per token equals subtracting the
        aggregated entropy). `pg_weights` [b, R] (importance-sampling correction,
        engine/training/importance.py) multiply the policy loss alone: the KL term is an expectation
        under the trainer's own policy, not under the sampler's, so it is not reweighted (as in verl)."""
        loss, stats = self.policy_loss(logp, old_logp, advantages, mask, self.config)
        if pg_weights is not None:
            loss = loss * pg_weights
        if self.uses_reference and ref_logp is not None:
            loss, stats = add_kl_penalty(loss, stats, logp, ref_logp, mask, self.config.kl_coef)
        if entropy is not None and self.entropy_coef > 0:
            loss, stats = add_entropy_bonus(loss, stats, entropy, mask, self.entropy_coef)
        return loss, stats

    # -- state
    def on_step_end(self, rollouts: Rollouts, step: int) -> None:
        """Update state after the optimizer steps of a training step (memories, schedules)."""

    def step_metrics(self, rollouts: Rollouts) -> dict[str, float]:
        """Algorithm-specific diagnostics for metrics.jsonl."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    @property
    def config_sections(self) -> list[str]:
        """Config sections this algorithm reads (written into the run's config.yaml)."""
        return [self.name]


class OnBase(Algorithm):
    """A shaping method on top of a base algorithm: every hook goes to the base unless overridden."""

    composes = True
    bases: tuple[str, ...] | None = None  # the bases it can sit on; None: any that does not compose
    # True where compute_advantages ignores the base's advantage estimator (it makes its own)
    replaces_advantages = False
    # True where shape_rewards leaves graded rewards that a pass/fail estimator (passk) would undo
    shapes_rewards = False

    @classmethod
    def check_settings(cls, sections, base, group_size):
        require(cls.bases is None or base in cls.bases,
                f"algo.base={base} is not a base {cls.name} can sit on; accepted: {', '.join(cls.bases or ())}")
        base_cls = ALGORITHMS.get(base)
        if not base_cls.composes:
            base_cls.check_settings(sections, base, group_size)
        estimator = getattr(sections[base], "adv_estimator", "grpo")
        require(not cls.replaces_advantages or estimator == "grpo",
                f"{base}.adv_estimator={estimator} has no effect under {cls.name}, which computes its own "
                f"advantages; accepted: grpo (the default)")
        others = ", ".join(n for n in ADV_ESTIMATORS.names() if n != "passk")
        require(not cls.shapes_rewards or estimator != "passk",
                f"{base}.adv_estimator=passk reads rewards as pass/fail and would discard {cls.name}'s reward "
                f"shaping; accepted: any other estimator ({others})")

    def __init__(self, config, context: AlgorithmContext, base: Algorithm):
        super().__init__(config, context)
        self.base = base
        # the diagnostics of this step, which a shaping hook sets; step_metrics adds them to the base's
        self._metrics: dict[str, float] = {}

    uses_reference = property(lambda self: self.base.uses_reference)
    loss_agg = property(lambda self: self.base.loss_agg)

    def observe_forward(self, rollouts, view):
        self.base.observe_forward(rollouts, view)

    def observe_probe(self, rollouts, tokenizer):
        self.base.observe_probe(rollouts, tokenizer)

    def forward_needs(self, num_layers, records_lens):
        # the base's needs, and the safe guess for a shaping method's own undeclared observe_forward
        own = ForwardNeeds(view="rewards" if type(self).observe_forward is not OnBase.observe_forward else None)
        return self.base.forward_needs(num_layers, records_lens).merged(own)

    def reward_components(self, rollouts):
        return self.base.reward_components(rollouts)

    def generation_rounds(self):
        return self.base.generation_rounds()

    def short_batch_hint(self):
        return self.base.short_batch_hint()

    def keep_groups(self, rollouts):
        return self.base.keep_groups(rollouts)

    def shape_rewards(self, rollouts):
        self.base.shape_rewards(rollouts)

    def compute_advantages(self, rollouts):
        return self.base.compute_advantages(rollouts)

    def loss_mask(self, rollouts):
        return self.base.loss_mask(rollouts)

    entropy_coef = property(lambda self: self.base.entropy_coef)

    def token_loss(self, logp, old_logp, advantages, mask, ref_logp=None, pg_weights=None, entropy=None):
        return self.base.token_loss(logp, old_logp, advantages, mask, ref_logp, pg_weights, entropy)

    def on_step_end(self, rollouts, step):
        self.base.on_step_end(rollouts, step)

    def step_metrics(self, rollouts):
        return {**self.base.step_metrics(rollouts), **self._metrics}

    def state_dict(self):
        return {"base": self.base.state_dict()}

    def load_state_dict(self, state):
        self.base.load_state_dict(state.get("base", {}))

    @property
    def config_sections(self):
        return [self.name] + self.base.config_sections


def correct_mask(rollouts: Rollouts) -> torch.Tensor:
    """[B] bool: the responses the grader found correct."""
    return torch.tensor([bool(v.correct) for v in rollouts.verdicts], dtype=torch.bool)


def mean_where(values: torch.Tensor, where: torch.Tensor) -> float:
    """Mean of values[where] for a diagnostic: 0.0 when nothing is selected (not NaN)."""
    return values[where].mean().item() if where.any() else 0.0


def compose_algorithm(name: str, base: str, sections: Mapping[str, Any], context: AlgorithmContext) -> Algorithm:
    """The algorithm `name` with its config section, wrapped around the algorithm `base` when it
    composes (a shaping method); `sections` maps algorithm names to their config sections."""
    cls = ALGORITHMS.get(name)
    if not cls.composes:
        return cls(sections[cls.name], context)
    base_cls = ALGORITHMS.get(base)
    if base_cls.composes:
        bases = [e.name for e in ALGORITHMS.entries() if not e.obj.composes]
        raise UserError(f"--base '{base}' is itself a shaping method; accepted bases: {', '.join(bases)}")
    return cls(sections[cls.name], context, base_cls(sections[base_cls.name], context))
