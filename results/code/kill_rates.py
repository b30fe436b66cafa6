"""How many wrong programs the built-in code task's hidden tests reject, per family and per number of tests.

    python results/code/kill_rates.py [--set suite|later|blind|last] [--rows 60] [--seeds 0 1] [--tests 2 4 ...] [--out F]

For every family and every ``tests_per_prompt`` of ``--tests``: ``--rows`` rows of ``make_code_task`` per seed, and
on each row every program of the mutant suite (tests/data/code_mutants.py: the family's plausible wrong programs
and the shortcuts that ignore the input) graded as the code reward grades it (strict comparison, every test).
A mutant is *rewarded* on a row when it passes every test. The table gives, per family, the share of (mutant, row)
pairs rewarded (``mean``) and the rewarded share of the worst mutant (``worst``, named); the last column checks the
correct programs (the reference and the other idioms of the suite, on the tests and the fresh tests) at the default
number of tests; the last line how many of the rewarded wrong programs the rows' fresh tests (the ``holdout_fail``
detector) catch.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "data")]

import random  # noqa: E402

from code_mutants import blind_mutants, last_mutants, later_mutants, mutants, reference, rewarded, variants  # noqa: E402

from graft.data.code_task import CODE_FAMILIES, FRESH_TESTS, TESTS_PER_PROMPT, make_code_task, spec_of  # noqa: E402

PROBES = 300
"""Random inputs of the family (plus its edge classes) on which a program of the second set must differ from the
family's reference somewhere to count as wrong."""


def wrong(program: str, row: dict) -> bool:
    """Whether ``program`` differs from the row's reference on some input of :data:`PROBES` draws and the edges."""
    spec, rng = spec_of(row), random.Random(7)
    args = spec.edges(rng) + [spec.draw(rng) for _ in range(PROBES)]
    calls = [f"assert {spec.name}({', '.join(map(repr, a))}) == {spec.ref(*a)!r}" for a in args]
    return not rewarded(program, calls)


def rows_of(family: str, n_rows: int, seeds: list[int], tests: int) -> list[dict]:
    n = min(n_rows, 8) if family == "factorial" else n_rows
    return [r for s in seeds for r in make_code_task(n, s, [family], tests_per_prompt=tests)]


SETS = {"suite": None, "later": later_mutants, "blind": blind_mutants, "last": last_mutants}
"""``suite``: the mutant suite (tests/data/code_mutants.py ``mutants``); ``later``, ``blind``, ``last``: the second,
third and fourth sets of wrong programs, each written after the tests of its time (each counted on the rows where it
is wrong at all)."""


def family_rates(family: str, n_rows: int, seeds: list[int], tests: int, which: str = "suite") -> dict:
    """Per mutant label: (rewarded rows, rows); plus the correct programs' failures and the fresh-test catches."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    correct_fail, caught, escaped = [], 0, 0
    for row in rows_of(family, n_rows, seeds, tests):
        extra = SETS[which]
        programs = {k: v for k, v in extra(row).items() if wrong(v, row)} if extra else mutants(row)
        for label, program in programs.items():
            hit = rewarded(program, row["tests"])
            counts[label][0] += hit
            counts[label][1] += 1
            if hit:
                fresh_ok = rewarded(program, row.get("fresh_tests", []))
                caught += not fresh_ok
                escaped += fresh_ok
        for label, program in {"reference": reference(row), **variants(row)}.items():
            if not rewarded(program, row["tests"] + row.get("fresh_tests", [])):
                correct_fail.append((row["id"], label))
    return {"counts": dict(counts), "correct_fail": correct_fail, "caught": caught, "escaped": escaped}


def summary(rates: dict) -> tuple[float, float, str]:
    """(mean rewarded share over (mutant, row) pairs, worst mutant's share, its label)."""
    counts = rates["counts"]
    hits = sum(h for h, _ in counts.values())
    total = sum(n for _, n in counts.values())
    if not counts:
        return 0.0, 0.0, "-"
    label, (h, n) = max(counts.items(), key=lambda kv: kv[1][0] / kv[1][1])
    return hits / total, h / n, label


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=60, help="rows per family and seed (factorial: at most 8)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--tests", type=int, nargs="+", default=[2, 4, 6, 8, 10, 12])
    ap.add_argument("--set", choices=sorted(SETS), default="suite", help="which wrong programs (SETS)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    results = {n: {f: family_rates(f, args.rows, args.seeds, n, args.set) for f in CODE_FAMILIES} for n in args.tests}
    head = "| family | mutants | " + " | ".join(f"{n} tests: mean / worst" for n in args.tests) + " | correct programs failed |"
    lines = [head, "|---|---:|" + "---:|" * len(args.tests) + "---:|"]
    default = results.get(TESTS_PER_PROMPT) or results[args.tests[-1]]
    for f in CODE_FAMILIES:
        cells = []
        for n in args.tests:
            mean, worst, label = summary(results[n][f])
            cells.append(f"{mean:.1%} / {worst:.1%}" + (f" ({label})" if worst > 0.05 else ""))
        lines.append(
            f"| {f} | {len(results[args.tests[0]][f]['counts'])} | "
            + " | ".join(cells)
            + f" | {len(default[f]['correct_fail'])} |"
        )
    overall = []
    for n in args.tests:
        hits = sum(h for f in CODE_FAMILIES for h, _ in results[n][f]["counts"].values())
        total = sum(t for f in CODE_FAMILIES for _, t in results[n][f]["counts"].values())
        overall.append(f"{hits / total:.2%}")
    lines.append("| **all** | | " + " | ".join(overall) + " | |")
    detector = []
    for n in args.tests:
        caught = sum(results[n][f]["caught"] for f in CODE_FAMILIES)
        escaped = sum(results[n][f]["escaped"] for f in CODE_FAMILIES)
        detector.append(f"{caught} of {caught + escaped}" if caught + escaped else "none rewarded")
    lines.append("| rewarded ones the fresh tests catch | | " + " | ".join(detector) + " | |")
    cmd = "python results/code/kill_rates.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = "\n".join(
        [
            f"    {cmd}",
            "",
            f"{args.rows} rows per family and seed, seeds {args.seeds}; "
            + (f"the {args.set} set of wrong programs (each counted on the rows where it is wrong at all)"
               if SETS[args.set] else "the mutant suite of tests/data/code_mutants.py")
            + f"; "
            f"{time.perf_counter() - t0:.0f} s. Share of (mutant, row) pairs a wrong program is rewarded on (mean) and "
            "the share of rows of the family's worst mutant (named when above 5 %):",
            "",
            *lines,
            "",
            f"The default is {TESTS_PER_PROMPT} tests. The last line: of the (mutant, row) pairs rewarded, how many the "
            f"row's {FRESH_TESTS} fresh tests (the holdout_fail detector, never in the reward) catch.",
            "",
        ]
    )
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
