"""Tasks (training data + rewards), benchmarks (eval loaders + graders), pass@k and the code sandbox."""

import importlib
import logging

# The modules that register tasks or benchmarks, each with the optional packages (import names)
# it may need beyond the project's required dependencies. None needs one today; a benchmark built
# on an extra (say `evalplus`) names it here, and without it installed only that module is skipped.
REGISTERING_MODULES: dict[str, tuple[str, ...]] = {
    "benchmarks.tasks": (),
    "benchmarks.reasoning_gym_task": (),  # imports reasoning_gym only when the task is chosen
    "benchmarks.math_benchmarks": (),
    "benchmarks.code_benchmarks": (),
}

log = logging.getLogger(__name__)


def load_all(modules: dict[str, tuple[str, ...]] | None = None) -> dict[str, str]:
    """Import every module that registers tasks or benchmarks; returns {module: why it was skipped}.

    Only a missing package that the module declares optional is skipped (with a logged reason);
    anything else raises: a module that is missing, a required dependency that is not installed,
    or a module that is broken, so a bug never looks like an absent benchmark.
    """
    skipped = {}
    for name, optional in (REGISTERING_MODULES if modules is None else modules).items():
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            package = (err.name or "").split(".")[0]
            if package not in optional:
                raise
            skipped[name] = f"{name} needs the optional package '{package}', which is not installed"
            log.warning("%s: its tasks and benchmarks are not registered", skipped[name])
    return skipped
