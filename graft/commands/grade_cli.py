"""``graft grade CONFIG --responses FILE.jsonl``: grade responses the way a run would, and show the monitor's flags.

How a user debugs a reward before training: each row ``{id, response}`` is graded against the prompt with that
id in the config's data (``data.train``, then ``data.val``; or ``--data FILE``), by the config's domain or its own
reward functions (:func:`graft.domains.grading.make_grader`, the same grader a run builds), and printed with its
reward, status and the domain's reward-monitor flags; a last line sums them up.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from graft.commands.parsers import grade_parser
from graft.config import load_config
from graft.domains.grading import load_data, make_grader, task_domain
from graft.errors import UserError
from graft.success import succeeded
from graft.types import Prompt


class GradeError(UserError, ValueError):
    """A responses file that cannot be graded; the message names the file and line."""


def read_responses(path: Path, prompts: dict[str, Prompt]) -> list[tuple[Prompt, str]]:
    """``(prompt, response)`` of every row of ``path`` (JSONL ``{id, response}``), in file order."""
    if not path.is_file():
        raise GradeError(f"--responses: file not found: {path}")
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise GradeError(f"{path}, line {i}: invalid JSON ({e.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("response"), str) or "id" not in row:
            raise GradeError(f'{path}, line {i}: expected {{"id": ..., "response": "..."}}')
        pid = str(row["id"]).strip()
        if pid not in prompts:
            raise GradeError(f"{path}, line {i}: id {pid!r} is in none of the data ({len(prompts)} prompts)")
        out.append((prompts[pid], row["response"]))
    if not out:
        raise GradeError(f"{path}: no responses")
    return out


def grade_main(argv: list[str]) -> int:
    args = grade_parser().parse_intermixed_args(argv)
    cfg = load_config(args.config, args.overrides)
    specs = [args.data] if args.data else [s for s in (cfg.data.train, cfg.data.val) if s]
    prompts = {q.id: q for spec in specs for q in load_data(spec, cfg)[0]}
    items = read_responses(Path(args.responses), prompts)
    domain = task_domain(cfg.reward)
    with make_grader(cfg.reward) as grader:
        rewards, statuses = grader.grade([r for _, r in items], [q.answer for q, _ in items])
    flagged: Counter = Counter()
    for (q, response), reward, status in zip(items, rewards, statuses, strict=True):  # a grade per response
        flags = [k for k, v in domain.response_flags(response, q.problem, q.answer, status).items() if v]
        if succeeded(reward, cfg.reward.success_threshold):
            flagged.update(flags)
        if args.json:
            print(json.dumps({"id": q.id, "reward": reward, "status": status, "flags": flags}))
        else:
            print(f"{q.id}\treward {reward:g}\t{status}" + (f"\tflags: {', '.join(flags)}" if flags else ""))
    rewarded = sum(succeeded(r, cfg.reward.success_threshold) for r in rewards)
    print(
        f"{len(items)} responses graded by {cfg.reward.function or cfg.reward.domain}: mean reward "
        f"{sum(rewards) / len(rewards):.3f}, {rewarded} rewarded; statuses {dict(Counter(statuses))}; flags among the "
        f"rewarded {dict(flagged) or 'none'}",
        file=sys.stderr if args.json else sys.stdout,
    )
    return 0
