"""Draw rewarded responses from a probe's ``--samples`` file to read them, and check every rewarded program.

    python results/code/draw_rewarded.py results/code/probe_v2_rewarded.jsonl -n 20 --seed 0 --check 300

The file holds one graded response a line (``graft probe --samples``: model, prompt id, sample index, reward,
status, response). ``-n`` of those with reward 1 are drawn with ``random.Random(--seed)`` and printed in file order:
the model, prompt id, sample index, status, and the program the reward graded (the response's last fenced Python
block, :func:`graft.reward.code_monitor.extract_program`). ``--keep FILE`` writes the
rewarded lines alone (what results/code/ commits of a probe's samples).

``--check N`` (for a probe of the procedural task: ``--task-seed`` and ``--num-prompts`` are its ``data.code_task``
settings, which give each prompt id's function) also runs EVERY rewarded program, in the sandbox, on its family's edge
classes and ``N`` random inputs of its function (drawn with ``random.Random(7)``) and compares each value with the
reference strictly, as the reward does: it prints the programs that differ somewhere (a wrong program the row's tests
let through) and how many.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from graft.data.code_task import make_code_task, spec_of  # noqa: E402
from graft.reward.code_monitor import extract_program  # noqa: E402
from graft.reward.sandbox import TestCase, run_tests  # noqa: E402


def differs(program: str, pid: str, entry: str, n: int) -> str | None:
    """None when ``program`` agrees with the reference of row ``pid``'s function on its edge classes and ``n`` random
    inputs; else the first input where it does not (and how)."""
    spec, rng = spec_of({"id": pid, "entry_point": entry}), random.Random(7)
    args = spec.edges(rng) + [spec.draw(rng) for _ in range(n)]
    calls = [f"{spec.name}({', '.join(map(repr, a))})" for a in args]
    r = run_tests(program, [TestCase(c, spec.ref(*a)) for c, a in zip(calls, args, strict=True)], timeout_s=60.0)
    if r.status == "ok" and r.passed == r.total:
        return None
    return f"{r.total - r.passed} of {r.total} inputs fail ({r.status}, first: {r.failure})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("samples", type=Path)
    ap.add_argument("-n", type=int, default=20, help="how many to draw (default 20)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", type=Path, help="write the rewarded lines alone to this file")
    ap.add_argument("--check", type=int, default=0, metavar="N", help="also run every rewarded program on N random inputs")
    ap.add_argument("--task-seed", type=int, default=1234, help="the probe's data.code_task.seed (for --check)")
    ap.add_argument("--num-prompts", type=int, default=256, help="the probe's data.code_task.num_prompts (for --check)")
    args = ap.parse_args(argv)
    lines = [line for line in args.samples.read_text().splitlines() if line.strip()]
    rewarded = [line for line in lines if json.loads(line)["reward"] > 0.5]
    if args.keep:
        args.keep.write_text("".join(line + "\n" for line in rewarded))
    picked = sorted(random.Random(args.seed).sample(range(len(rewarded)), min(args.n, len(rewarded))))
    print(f"{len(picked)} of {len(rewarded)} rewarded responses of {args.samples.name} ({len(lines)} lines), seed {args.seed}")
    for i in picked:
        row = json.loads(rewarded[i])
        program = (extract_program(row["response"]) or "").strip("\n")
        print(f"-- {row['model']} · {row['id']} · sample {row['i']} · {row['status']}")
        print("\n".join("   " + line for line in program.splitlines()))
    if args.check:
        entry = {r["id"]: r["entry_point"] for r in make_code_task(args.num_prompts, args.task_seed)}
        wrong = 0
        for line in rewarded:
            row = json.loads(line)
            why = differs(extract_program(row["response"]) or "", row["id"], entry[row["id"]], args.check)
            if why:
                wrong += 1
                print(f"!! {row['model']} · {row['id']} · sample {row['i']}: {why}")
        print(f"{wrong} of {len(rewarded)} rewarded programs differ from the reference on the edge classes and "
              f"{args.check} random inputs of their function")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
