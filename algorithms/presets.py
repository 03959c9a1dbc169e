"""Presets: a registered algorithm with a few settings, under a name of its own, for the methods
that live at a seam of an existing algorithm rather than in a class (an advantage estimator, a
policy loss, a loss term). `meds list` shows them beside the algorithms and `meds ablate --algos`
accepts their names; each is the config overrides it stands for.
"""

from meds_cli.core.registry import Registry

PRESETS: Registry[dict[str, object]] = Registry("preset")


def register_preset(name: str, description: str, overrides: dict[str, object]) -> None:
    PRESETS.register(name, description)(overrides)


register_preset("passk", "DAPO with the passk advantage estimator (dapo.adv_estimator=passk, k = dapo.passk_k)",
                {"algo.name": "dapo", "dapo.adv_estimator": "passk"})
register_preset("clip-cov", "DAPO with the Clip-Cov policy loss (dapo.policy_loss=clip-cov)",
                {"algo.name": "dapo", "dapo.policy_loss": "clip-cov"})
register_preset("kl-cov", "DAPO with the KL-Cov policy loss (dapo.policy_loss=kl-cov)",
                {"algo.name": "dapo", "dapo.policy_loss": "kl-cov"})
register_preset("entropy-bonus", "DAPO with the entropy bonus (dapo.entropy_coef=0.001)",
                {"algo.name": "dapo", "dapo.entropy_coef": 0.001})
register_preset("psr", "PSR: W-REINFORCE's correct responses only (w-reinforce.mode=psr; wrong ones leave the loss)",
                {"algo.name": "w-reinforce", "w-reinforce.mode": "psr"})
register_preset("nsr", "NSR: W-REINFORCE's wrong responses only (w-reinforce.mode=nsr; correct ones leave the loss)",
                {"algo.name": "w-reinforce", "w-reinforce.mode": "nsr"})
