"""``graft bench code-grading``: what grading one program of the ``code`` domain costs, per checkout.

    graft bench code-grading [--old CHECKOUT] [--new CHECKOUT] [--rows 64] [--reps 3] [--out FILE.json]

The sides: ``old`` (with ``--old``: another checkout's code, e.g. ``git worktree add --detach ../before COMMIT``) and
``new`` (``--new``, default: the checkout this graft was imported from); one side alone measures that checkout. Each
repetition runs, per side in turn (old, new, old, new, ...: a machine that drifts affects both alike), a fresh
interpreter whose working directory and ``PYTHONPATH`` are that side's checkout, which (1) builds ``--rows`` rows of the
built-in code task (``make_code_task(rows, seed=0)``: the default family mix and that checkout's default number of
tests), (2) runs the sandbox's one-off self-test (not timed), then (3) grades, one after the other, each row's
reference solution (every test runs; reward 1 asserted) and a wrong program of the same name (``return None``; reward
0 asserted) with that checkout's ``graft.reward.code.verify_code``: what one grader worker does per response. Prints
the median over repetitions of the mean seconds per program and each side's ratio to the first; ``--out`` keeps every
repetition. No torch: the sides import only their task generator and reward.
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

from graft.config import ConfigError
from graft.console import say
from graft.errors import UserError

THIS_CHECKOUT = Path(__file__).resolve().parents[2]
"""The folder this graft is imported from (a checkout, or site-packages for an installed wheel)."""

WORKER = r"""
import json, sys, time
import graft
from graft.data.code_task import make_code_task, solution
from graft.reward import sandbox
from graft.reward.code import code_reference, verify_code, warm_up

rows = make_code_task(int(sys.argv[1]), 0)
warm_up()
refs = [code_reference(r) for r in rows]
right = [solution(r) for r in rows]
wrong = ["```python\ndef %s(*args):\n    return None\n```" % r["entry_point"] for r in rows]
tests = sum(len(r["tests"]) for r in rows) / len(rows)
out = {"module": graft.__file__, "isolation": sandbox.isolation(), "tests_per_row": tests}
for name, programs, want in (("correct", right, 1.0), ("wrong", wrong, 0.0)):
    t0 = time.perf_counter()
    for program, ref in zip(programs, refs):
        reward, status = verify_code(program, ref, success_threshold=0.5)
        assert reward == want, (name, reward, status, program)
    out[name] = (time.perf_counter() - t0) / len(rows)
print(json.dumps(out))
"""
"""One repetition of one side, run as ``python -c WORKER ROWS`` in that side's checkout (an older checkout has no
``graft.bench.code_grading`` to import). Prints one JSON line: the module it imported, the isolation, tests per row and
the mean seconds per correct and per wrong program."""

KINDS = ("correct", "wrong")


def sides(args: argparse.Namespace) -> dict[str, Path]:
    """Side name -> the checkout whose code it runs (``old`` first when given)."""
    out = {"old": Path(args.old).resolve()} if args.old else {}
    out["new"] = Path(args.new or THIS_CHECKOUT).resolve()
    for name, code in out.items():
        if not (code / "graft" / "__init__.py").is_file():
            raise ConfigError(f"--{name} {code}: no graft package in that folder")
    return out


def run_side(code: Path, rows: int) -> dict:
    """One repetition on ``code``'s checkout: the worker's JSON line (seconds per program)."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    done = subprocess.run([sys.executable, "-c", WORKER, str(rows)], cwd=code, env=env, capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise UserError(f"grading on {code} failed (exit {done.returncode}): {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(codes: dict[str, Path], rows: int, reps: int) -> dict[str, list[dict]]:
    """``{side: [row per repetition]}``, sides alternating repetition by repetition."""
    raw: dict[str, list[dict]] = {name: [] for name in codes}
    for rep in range(reps):
        for name, code in codes.items():
            t0 = time.perf_counter()
            raw[name].append(run_side(code, rows))
            say(f"rep {rep + 1}/{reps} {name} ({code}): {time.perf_counter() - t0:.1f} s")
    return raw


def medians(raw: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Per side, the median over repetitions of the mean seconds per correct and per wrong program."""
    return {name: {k: statistics.median(r[k] for r in rs) for k in KINDS} for name, rs in raw.items()}


def table(raw: dict[str, list[dict]], codes: dict[str, Path]) -> list[str]:
    """The markdown table: per side its checkout, isolation, tests per row, ms per program and the ratio to the first
    side (> 1: that side costs more)."""
    med = medians(raw)
    first = med[next(iter(med))]
    lines = [
        "| side | checkout | isolation | tests per row | correct program: ms | wrong program: ms | correct / first | "
        "wrong / first |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, m in med.items():
        r = raw[name][0]
        lines.append(
            f"| {name} | `{codes[name]}` | {r['isolation']} | {r['tests_per_row']:.1f} | {m['correct'] * 1e3:.1f} | "
            f"{m['wrong'] * 1e3:.1f} | {m['correct'] / first['correct']:.2f}x | {m['wrong'] / first['wrong']:.2f}x |"
        )
    return lines


def run(args: argparse.Namespace) -> int:
    """``graft bench code-grading``: every side's grading cost, a table on stdout, every repetition in ``--out``."""
    if args.rows < 1 or args.reps < 1:
        raise ConfigError(f"--rows and --reps must be >= 1, got {args.rows} and {args.reps}")
    codes = sides(args)
    raw = measure(codes, args.rows, args.reps)
    head = (
        f"{platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}; {args.rows} rows x {args.reps} "
        "repetitions per side, alternating; medians over repetitions of the mean per program:"
    )
    print("\n".join([head, "", *table(raw, codes)]))
    if args.out:
        out = {"raw": raw, "medians": medians(raw), "args": vars(args), "checkouts": {k: str(v) for k, v in codes.items()}}
        Path(args.out).write_text(json.dumps(out, indent=2))
    return 0
