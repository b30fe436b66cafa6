"""Held-out evaluation splits of a config's procedural task, disjoint from its training prompts.

    python scripts/make_task_splits.py configs/default.yaml --out results/mini-repro/data --test 64 --hard 64

Writes ``test.jsonl`` (the training task's families and operand range, another seed, no problem shared
with the ``data.arithmetic.num_prompts`` training prompts) and ``test_hard.jsonl`` (the same families with
operands up to ``--hard-scale`` times larger, disjoint from training and from ``test.jsonl``). "The same
problem" is the same computation in any wording (``graft.data.arithmetic.problem_key``: its integers and answer),
not only the same text. ``--exclude``
names earlier splits (JSONL) whose problems must not recur either, so that a confirmation can be graded on
prompts no earlier result was read on. Rows are
``{id, problem, answer, source}`` like ../shared/data, so ``graft eval --data NAME=PATH`` reads them.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config")
    ap.add_argument("--out", required=True)
    ap.add_argument("--test", type=int, default=64, help="prompts in test.jsonl")
    ap.add_argument("--hard", type=int, default=64, help="prompts in test_hard.jsonl")
    ap.add_argument("--hard-scale", type=int, default=3, help="operand range multiplier of the hard split")
    ap.add_argument("--seed", type=int, default=777, help="seed of the test splits (the training task's is data.arithmetic.seed)")
    ap.add_argument("--exclude", action="append", default=[], metavar="JSONL",
                    help="an earlier split whose problems the new ones must not repeat (besides the training "
                         "prompts); repeat the option for several")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_intermixed_args(argv)

    from graft.config import load_config
    from graft.data.arithmetic import make_families, problem_key
    from graft.data.datasets import load_prompts
    from graft.errors import UserError

    try:
        cfg = load_config(args.config, args.overrides)
        ar = cfg.data.arithmetic
        if cfg.data.train != "arithmetic" or not ar.families:
            raise UserError("the config's data.train must be the procedural task with data.arithmetic.families")
        taken = {problem_key(p.problem, p.answer) for p in load_prompts("arithmetic", "error", ar)[0]}
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in args.exclude:
        try:
            taken |= {problem_key(p.problem, p.answer) for p in load_prompts(path, skip_hint="")[0]}
        except UserError as e:
            print(f"error: --exclude {path}: {e}", file=sys.stderr)
            return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        test = make_families(args.test, ar.families, ar.max_operand, args.seed, exclude=taken, key=problem_key)
        taken |= {problem_key(p.problem, p.answer) for p in test}   # the two splits are disjoint too
        splits = {"test": test, "test_hard": make_families(args.hard, ar.families, ar.max_operand * args.hard_scale,
                                                           args.seed + 1, exclude=taken, key=problem_key)}
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, prompts in splits.items():
        with open(out / f"{name}.jsonl", "w") as f:
            for p in prompts:
                f.write(json.dumps({"id": f"{name}-{p.id}", "problem": p.problem, "answer": p.answer,
                                    "source": f"graft arithmetic families, {name}"}) + "\n")
        print(f"{out / name}.jsonl: {len(prompts)} prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
