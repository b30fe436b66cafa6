"""``graft splits``: held-out evaluation splits of a config's procedural task, disjoint from its training prompts.

    graft splits configs/default.yaml --out results/mini-repro/data --test 64 --hard 64 [--exclude FILE ...] [key=value ...]

Writes ``test.jsonl`` (the training task's families and operand range, another seed, no problem shared
with the ``data.arithmetic.num_prompts`` training prompts) and ``test_hard.jsonl`` (the same families with
operands up to ``--hard-scale`` times larger, disjoint from training and from ``test.jsonl``). "The same
problem" is the same computation in any wording (``graft.data.arithmetic.problem_key``: its operands in any order,
written in digits or words or implied by the wording, and its answer: ``13 * 14``, ``Compute $14 \\times 13$.`` and
13 bags of 14 apples are one problem), not only the same text. ``--exclude`` names earlier splits (JSONL) whose
computations must not recur either, so that a confirmation can be graded on prompts no earlier result was read
on. Rows are ``{id, problem, answer, source}`` like the shared benchmark files, so ``graft eval --data NAME=PATH`` reads
them. Split files written before the key read number words and implied operands, such as the study's and its
confirmation's, are kept as they were: the same command today writes other files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from graft.commands.parsers import splits_parser
from graft.config import load_config
from graft.data.datasets import load_prompts
from graft.data.tasks import Task, require_families
from graft.errors import UserError
from graft.types import Prompt


def _taken(config: str, overrides: list[str], exclude: list[str]) -> tuple[set, Task, Any]:
    """The problem keys (:meth:`Task.key`) the new splits must avoid (the training prompts', then each ``--exclude``
    file's), and the config's task with its settings; a :class:`UserError` when the config or a file is unusable."""
    cfg = load_config(config, overrides)
    task, settings = require_families(cfg, "graft splits")
    taken = {task.key(p.problem, p.answer) for p in load_prompts(task.name, "error", cfg.data.tasks)[0]}
    for path in exclude:
        try:
            taken |= {task.key(p.problem, p.answer) for p in load_prompts(path, skip_hint="")[0]}
        except UserError as e:
            raise UserError(f"--exclude {path}: {e}") from e
    return taken, task, settings


def make_splits(
    task: Task, settings: Any, taken: set, test: int, hard: int, hard_scale: int, seed: int
) -> dict[str, list[Prompt]]:
    """``test`` and ``test_hard``: neither shares a problem (:meth:`Task.key`) with ``taken`` nor with the other."""
    first = task.held_out(settings, test, 1, seed, taken)
    taken = taken | {task.key(p.problem, p.answer) for p in first}  # the two splits are disjoint too
    return {"test": first, "test_hard": task.held_out(settings, hard, hard_scale, seed + 1, taken)}


def splits_main(argv: list[str] | None = None) -> int:
    args = splits_parser().parse_intermixed_args(argv)
    try:
        taken, task, settings = _taken(args.config, args.overrides, args.exclude)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        splits = make_splits(task, settings, taken, args.test, args.hard, args.hard_scale, args.seed)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, prompts in splits.items():
        with open(out / f"{name}.jsonl", "w") as f:
            for p in prompts:
                f.write(
                    json.dumps(
                        {
                            "id": f"{name}-{p.id}",
                            "problem": p.problem,
                            "answer": p.answer,
                            "source": f"graft {task.name} families, {name}",
                        }
                    )
                    + "\n"
                )
        print(f"{out / name}.jsonl: {len(prompts)} prompts")
    return 0
