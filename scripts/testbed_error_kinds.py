"""What the testbed base's sampled traces are (docs/testbed.md, "What the base's wrong answers are"):
the correct trace, exactly the trace of some student (one of the 63 combinations of the six bugs),
or neither (an arithmetic or copying slip of the model's own); and, for comparison, the share of
training-like traces (students drawn by the recipe's bug rates) that end on the right answer.

    OMP_NUM_THREADS=1 python scripts/testbed_error_kinds.py [--problems 40] [--samples 32]
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=40, help="held-out problems")
    parser.add_argument("--samples", type=int, default=32, help="samples per problem")
    parser.add_argument("--students", type=int, default=2000, help="problems of the training-like traces")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from meds_cli.engine.model_io.testbed_base import (
        TESTBED_RECIPE,
        base_folder,
        gym_items,
        held_out_items,
        sample_answers,
    )
    from meds_cli.engine.model_io.testbed_traces import BUGS, draw_student, parse_chain, worked_trace

    recipe = TESTBED_RECIPE
    folder = base_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    items = held_out_items(recipe)[:args.problems]
    responses = sample_answers(model, tokenizer, [item["question"] for item in items], args.samples,
                               recipe.max_new_tokens, seed=1, temperature=recipe.temperature)
    kinds = {"correct trace": 0, "a student's buggy trace": 0, "no student's trace": 0}
    for item, texts in zip(items, responses):
        terms, ops = parse_chain(item["metadata"]["expression"])
        correct = worked_trace(terms, ops)[0]
        buggy = {worked_trace(terms, ops, combo)[0]
                 for n in range(1, len(BUGS) + 1) for combo in itertools.combinations(BUGS, n)}
        for text in texts:
            kind = "correct trace" if text == correct else ("a student's buggy trace" if text in buggy
                                                            else "no student's trace")
            kinds[kind] += 1
    total = sum(kinds.values())
    print(f"base's samples ({len(items)} held-out problems x {args.samples}, temperature {recipe.temperature}):")
    for kind, count in kinds.items():
        print(f"  {kind}: {count / total:.3f}")

    rng = random.Random(1)
    right = 0
    for item in gym_items(recipe, 555, args.students):  # seeds 555.. : problems drawn as the recipe draws them
        terms, ops = parse_chain(item["metadata"]["expression"])
        student = draw_student(rng, dict(recipe.bug_rates))
        right += worked_trace(terms, ops, student)[1] == worked_trace(terms, ops)[1]
    print(f"training-like traces ending on the right answer: {right / args.students:.3f} of {args.students}")


if __name__ == "__main__":
    main()
