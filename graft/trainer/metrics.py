"""Per-step metrics: phase timers, group statistics and the JSONL writers."""
from __future__ import annotations

import json
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path

from graft.types import VERIFY_NO_ANSWER, VERIFY_TIMEOUT, RolloutGroup


@contextmanager
def timed(metrics: dict, phase: str):
    """Add the seconds spent in the block to ``metrics['time/{phase}_s']``."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        metrics[f"time/{phase}_s"] = metrics.get(f"time/{phase}_s", 0.0) + time.perf_counter() - t0


def group_stats(groups: list[RolloutGroup]) -> dict:
    """Reward, all-fail/all-correct fractions, lengths and verifier outcomes of own groups [P]."""
    P = len(groups)
    rewards = [r for g in groups for r in g.rewards]
    lengths = [len(t) for g in groups for t in g.token_ids]
    statuses = [s for g in groups for s in g.status]
    return {
        "reward/mean": sum(rewards) / max(len(rewards), 1),
        "all_fail_frac": sum(g.num_correct == 0 for g in groups) / max(P, 1),
        "all_correct_frac": sum(g.num_correct == g.size for g in groups) / max(P, 1),
        "response_length/mean": sum(lengths) / max(len(lengths), 1),
        "truncated_frac": sum(not f for g in groups for f in g.finished) / max(len(rewards), 1),
        "verify/timeouts": statuses.count(VERIFY_TIMEOUT),
        "verify/no_answer": statuses.count(VERIFY_NO_ANSWER),
    }


def prefixed(prefix: str, metrics: dict) -> dict:
    return {f"{prefix}/{k}": v for k, v in metrics.items()}


def _clean(v):
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    return v


class JsonlWriter:
    """Append-only JSONL file; each line is flushed and fsynced, so a kill loses at most the line in flight."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict) -> None:
        line = json.dumps({k: _clean(v) for k, v in record.items()}, default=float)
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def truncate_after(self, step: int) -> None:
        """Drop records of steps > ``step`` (and a torn last line) when resuming."""
        if not self.path.exists():
            return
        keep = []
        for line in self.path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("step", -1) <= step:
                keep.append(line)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(l + "\n" for l in keep))
        os.replace(tmp, self.path)

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
        return out


def console_line(step: int, steps: int, m: dict, models: list[str]) -> str:
    parts = [f"step {step}/{steps}"]
    for name in models:
        parts.append(f"{name}: reward {m.get(f'{name}/reward/mean', float('nan')):.3f} "
                     f"all-fail {m.get(f'{name}/all_fail_frac', float('nan')):.2f} "
                     f"peer {m.get(f'{name}/peer_responses', 0)}")
    ex = [k for k in m if k.endswith("/admitted") and k.startswith("exchange/")]
    for k in ex:
        parts.append(f"{k.split('/')[1]} admitted {m[k]}")
    parts.append(f"{m.get('time/step_s', 0):.1f}s")
    return " | ".join(parts)
