"""How many of an eval's samples differ from another eval's of the same problems: a check that a
trained run samples differently from its base model (evals with the same seed draw the same
random numbers for each problem and sample, so an unchanged policy gives the same texts).

    python scripts/samples_differ.py BASE_EVAL_DIR EVAL_DIR [EVAL_DIR ...]

Each EVAL_DIR holds a samples.jsonl (`meds eval ... --output DIR`, or RUN/eval/heldout of
`meds ablate`). Prints, per eval, the samples it shares with the base (same benchmark, problem
and sample index) and the share whose response text differs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_samples(folder: Path) -> dict[tuple, str]:
    """(benchmark, problem_id, sample) -> response text of an eval folder's samples.jsonl."""
    samples = {}
    with open(Path(folder) / "samples.jsonl") as lines:
        for line in lines:
            row = json.loads(line)
            samples[(row["benchmark"], row["problem_id"], row["sample"])] = row["response"]
    return samples


def differing_share(base: dict[tuple, str], other: dict[tuple, str]) -> tuple[int, float]:
    """(samples both have, share of them whose texts differ)."""
    shared = base.keys() & other.keys()
    if not shared:
        return 0, float("nan")
    return len(shared), sum(base[key] != other[key] for key in shared) / len(shared)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path)
    parser.add_argument("evals", type=Path, nargs="+")
    args = parser.parse_args()
    base = read_samples(args.base)
    print(f"{'eval':<60} {'shared':>7} {'differ':>7}")
    for folder in args.evals:
        shared, share = differing_share(base, read_samples(folder))
        print(f"{str(folder):<60} {shared:>7} {share:>7.1%}")


if __name__ == "__main__":
    main()
