"""`meds ablate --algos`: algorithms as variants of one ablation.

A name is a registered algorithm (`meds list`: dapo, meds, w-reinforce, ...; a shaping method
sits on the base config's algo.base) or a preset (passk, clip-cov, ...: an algorithm with the
settings the preset names, algorithms/presets.py). Every variant is the same base config and
seeds with only these overrides; the baseline, the variant every other is compared with, runs
first: the first name, or --baseline NAME (added at the front when it is not among the names).

The base-model arm (`base_model: true` in a grid, --base-model) is the base config's model
evaluated as it is: an arm of train.steps 0 (a run folder of 0 steps is its base model, as `meds
eval RUN` evaluates it), so every trained arm is also compared with the model it started from
(ablate_report.py), seed by seed on the seed's own held-out split.
"""

from __future__ import annotations

from meds_cli.core.errors import UserError, nearest

BASE_MODEL_ARM = ("base-model", {"train.steps": 0})


def trains(overrides: dict) -> bool:
    """Whether a variant (its overrides) trains at all: an arm of train.steps 0 is its base model,
    evaluated as is."""
    return overrides.get("train.steps") != 0


def known_names() -> list[str]:
    import algorithms  # noqa: F401  (registers the algorithms)
    from algorithms import ALGORITHMS
    from algorithms.presets import PRESETS

    return sorted(set(ALGORITHMS.names()) | set(PRESETS.names()))


def algorithm_overrides(name: str) -> dict:
    """The config overrides that make the base config run algorithm or preset `name`."""
    from algorithms import ALGORITHMS
    from algorithms.presets import PRESETS

    if name in PRESETS:
        return dict(PRESETS.get(name))
    if name in ALGORITHMS:
        return {"algo.name": name}
    names = known_names()
    raise UserError(f"unknown algorithm or preset '{name}' in --algos{nearest(name, names)}; "
                    f"accepted: {', '.join(names)}")


def algorithm_variants(algos: list[str], baseline: str | None) -> list[tuple[str, dict]]:
    """(name, overrides) per algorithm, the baseline first."""
    order = list(algos)
    if baseline is not None:
        order = [baseline] + [a for a in order if a != baseline]
    repeated = sorted({a for a in order if order.count(a) > 1})
    if repeated:
        raise UserError(f"--algos names '{repeated[0]}' twice; give each algorithm once")
    return [(name, algorithm_overrides(name)) for name in order]


def read_algos(value, where: str) -> list[str]:
    """A list of names from a grid file's `algos:` (a list or a comma-separated string)."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) and v.strip() for v in items):
        raise UserError(f"{where}: algos must be a list of algorithm or preset names, e.g. [dapo, meds, passk]; "
                        f"got {value!r}")
    return [v.strip() for v in items]
