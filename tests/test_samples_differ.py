import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("samples_differ", ROOT / "scripts" / "samples_differ.py")
samples_differ = importlib.util.module_from_spec(spec)
spec.loader.exec_module(samples_differ)


def _eval(folder: Path, responses: dict[tuple[str, int], str]) -> Path:
    folder.mkdir()
    with open(folder / "samples.jsonl", "w") as out:
        for (problem, sample), response in responses.items():
            row = {"benchmark": "b", "problem_id": problem, "sample": sample, "response": response}
            out.write(json.dumps(row) + "\n")
    return folder


def test_share_of_differing_samples_among_the_shared_ones(tmp_path):
    base = samples_differ.read_samples(_eval(tmp_path / "base", {("p1", 0): "a", ("p1", 1): "b", ("p2", 0): "c"}))
    # p1/0 the same, p1/1 changed, p2/0 absent from the other eval, p3/0 absent from the base
    other = samples_differ.read_samples(_eval(tmp_path / "other", {("p1", 0): "a", ("p1", 1): "B", ("p3", 0): "x"}))
    assert samples_differ.differing_share(base, other) == (2, 0.5)
    assert samples_differ.differing_share(base, base) == (3, 0.0)
