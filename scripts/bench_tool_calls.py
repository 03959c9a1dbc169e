"""What a tool call costs: seconds per block as a response's session grows (each call replays the
earlier blocks, meds_cli/engine/rollout/tools/python_session.py), and many responses' blocks
through the pool at once.

Usage: python scripts/bench_tool_calls.py [--blocks N] [--responses N] [--workers N] [--sympy]

1. One response: N blocks in turn (block k assigns a variable and prints the sum so far), the
   wall-clock seconds of each call; --sympy starts the first block with `import sympy`, as TIR
   answers often do, so every later call pays for that import again in the replay.
2. N responses at once: one round of blocks through the pool, seconds in all and per block.
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.sandbox import isolation_mode  # noqa: E402
from meds_cli.core.cpu_budget import worker_count  # noqa: E402
from meds_cli.engine.rollout.tools.python_session import PythonSession, run_blocks  # noqa: E402


def block(k: int, sympy: bool) -> str:
    head = "import sympy\n" if sympy and k == 0 else ""
    return head + f"v{k} = {k}\nprint(sum([{', '.join(f'v{j}' for j in range(k + 1))}]))"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--responses", type=int, default=8)
    parser.add_argument("--workers", type=int, default=0, help="pool size (0: this process's CPU budget)")
    parser.add_argument("--sympy", action="store_true")
    args = parser.parse_args()
    workers = args.workers or worker_count()
    print(f"isolation: {isolation_mode()}, workers: {workers}")
    session = PythonSession()
    for k in range(args.blocks):
        start = time.perf_counter()
        [result] = run_blocks([(session, block(k, args.sympy))], workers=1)
        print(f"block {k + 1} (replays {k}): {time.perf_counter() - start:.3f} s, output {result.output.strip()!r}")
    sessions = [PythonSession() for _ in range(args.responses)]
    start = time.perf_counter()
    results = run_blocks([(s, block(0, args.sympy)) for s in sessions], workers=workers)
    seconds = time.perf_counter() - start
    assert all(r.outcome == "passed" for r in results)
    each = seconds / args.responses
    print(f"{args.responses} responses' first blocks at once: {seconds:.3f} s, {each:.3f} s a block")


if __name__ == "__main__":
    main()
