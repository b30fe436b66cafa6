"""What grading one program of the ``code`` domain costs: wall-clock seconds per program, one program after another.

    python benchmarks/code_grading_cost.py [--trees DIR [DIR ...]] [--rows 64] [--reps 3] [--out FILE.md]

Each ``--trees`` entry is a folder holding a ``graft`` package (the current checkout by default; an older commit
unpacked with ``git archive COMMIT graft | tar -x -C DIR``). For every repetition, each tree in turn runs a fresh
interpreter with that tree first on ``sys.path`` which (1) builds ``--rows`` rows of the built-in code task
(``make_code_task(rows, seed=0)``, the default family mix, that tree's default number of tests), (2) runs the
sandbox's one-off self-test (not timed), then (3) grades, one after the other, each row's reference solution
(every test runs; reward 1 asserted) and a wrong program of the same name (``return None``; reward 0 asserted)
with that tree's ``graft.reward.code.verify_code`` -- what one grader worker does per response. The trees
alternate repetition by repetition (A, B, A, B, ...), so a machine that slows down affects both; the table gives
the median over repetitions of the mean seconds per program, and the ratio of each tree to the first.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

WORKER = r"""
import json, sys, time
from graft.data.code_task import make_code_task, solution
from graft.reward import sandbox
from graft.reward.code import code_reference, verify_code, warm_up

rows = make_code_task(int(sys.argv[1]), 0)
warm_up()
refs = [code_reference(r) for r in rows]
right = [solution(r) for r in rows]
wrong = ["```python\ndef %s(*args):\n    return None\n```" % r["entry_point"] for r in rows]
out = {"isolation": sandbox.isolation(), "tests_per_row": sum(len(r["tests"]) for r in rows) / len(rows)}
for name, programs, want in (("correct", right, 1.0), ("wrong", wrong, 0.0)):
    t0 = time.perf_counter()
    for program, ref in zip(programs, refs):
        reward, status = verify_code(program, ref)
        assert reward == want, (name, reward, status, program)
    out[name] = (time.perf_counter() - t0) / len(rows)
print(json.dumps(out))
"""


def run_tree(tree: Path, rows: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(  # run in the tree: `python -c` puts the working folder first on sys.path
        [sys.executable, "-c", WORKER, str(rows)], env=env, cwd=tree, capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise SystemExit(f"{tree}: the worker failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(trees: list[Path], runs: dict[str, list[dict]]) -> list[str]:
    lines = [
        "| tree | isolation | tests per row | correct program: s per program | wrong program: s per program | "
        "correct / first tree | wrong / first tree |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    base = {k: statistics.median(r[k] for r in runs[str(trees[0])]) for k in ("correct", "wrong")}
    for tree in trees:
        rs = runs[str(tree)]
        med = {k: statistics.median(r[k] for r in rs) for k in ("correct", "wrong")}
        lines.append(
            f"| `{tree}` | {rs[0]['isolation']} | {rs[0]['tests_per_row']:.1f} | {med['correct'] * 1e3:.1f} ms | "
            f"{med['wrong'] * 1e3:.1f} ms | {med['correct'] / base['correct']:.2f}x | {med['wrong'] / base['wrong']:.2f}x |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", nargs="+", type=Path, default=[REPO], help="folders each holding a graft package")
    ap.add_argument("--rows", type=int, default=64, help="rows of the code task graded per repetition")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per tree (alternating)")
    ap.add_argument("--out", type=Path, help="write the table and raw values here (markdown)")
    args = ap.parse_args(argv)
    trees = [t.resolve() for t in args.trees]
    for t in trees:
        if not (t / "graft" / "__init__.py").is_file():
            ap.error(f"--trees: {t} holds no graft package")
    runs: dict[str, list[dict]] = {str(t): [] for t in trees}
    for rep in range(args.reps):
        for t in trees:
            t0 = time.perf_counter()
            runs[str(t)].append(run_tree(t, args.rows))
            print(f"rep {rep + 1}/{args.reps} {t}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    cmd = "python benchmarks/code_grading_cost.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = "\n".join(
        [
            f"    {cmd}",
            "",
            f"{platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}, {args.rows} rows x "
            f"{args.reps} repetitions per tree, alternating; medians over repetitions of the mean per program.",
            "",
            *table(trees, runs),
            "",
            "Raw (seconds per program, per repetition):",
            "",
            "```json",
            json.dumps(runs, indent=1),
            "```",
            "",
        ]
    )
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
