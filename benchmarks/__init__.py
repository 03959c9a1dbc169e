"""Tasks (training data + rewards), benchmarks (eval loaders + graders), pass@k and the code sandbox."""


def load_all() -> None:
    """Import every module that registers tasks or benchmarks (modules not yet present are skipped)."""
    import importlib

    for name in ("benchmarks.tasks", "benchmarks.math_benchmarks", "benchmarks.code_benchmarks"):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:
                raise
