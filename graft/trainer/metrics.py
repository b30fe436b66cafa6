"""Per-step metrics: phase timers, group statistics, the JSONL writers and run-folder checks.

JSON outputs never hold NaN or infinities (which are not JSON): :func:`json_safe` turns them
into ``null`` at any depth (audit rows nest lists of dicts), and the writers encode with
``allow_nan=False`` so a value that slipped through fails loudly instead of writing
``-Infinity``.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Mapping

from graft.files import OutputError, dumps_json, writing
from graft.success import succeeded
from graft.types import VERIFY_ERROR, VERIFY_NO_ANSWER, VERIFY_OK, VERIFY_TIMEOUT, RolloutGroup


@contextmanager
def timed(metrics: dict, phase: str):
    """Add the seconds spent in the block to ``metrics['time/{phase}_s']``."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        metrics[f"time/{phase}_s"] = metrics.get(f"time/{phase}_s", 0.0) + time.perf_counter() - t0


def _std(xs: list[float]) -> float:
    """Population standard deviation (divides by N; 0 for one value)."""
    m = sum(xs) / max(len(xs), 1)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / max(len(xs), 1))


def group_stats(groups: list[RolloutGroup], threshold: float) -> dict:
    """Reward (mean, std), all-fail/all-correct fractions (no / every response above ``threshold``,
    ``reward.success_threshold``), lengths (mean, min, max), verifier outcomes (and the domain's own failure kinds,
    ``verify/failed/KIND``), advantages (mean, std, min, max; ``None`` before they are computed) and each reward
    function's values (:func:`reward_function_stats`) of own groups [P] of G responses; every statistic is over the
    P x G responses, standard deviations divide by P x G (the reward functions': by N - 1, as TRL)."""
    P = len(groups)
    rewards = [r for g in groups for r in g.rewards]
    lengths = [len(t) for g in groups for t in g.token_ids]
    statuses = [s for g in groups for s in g.status]
    adv = [a for g in groups for a in (g.advantages or [])]
    return (
        {
            "reward/mean": sum(rewards) / max(len(rewards), 1),
            "reward/std": _std(rewards),
            "advantage/mean": sum(adv) / len(adv) if adv else None,
            "advantage/std": _std(adv) if adv else None,
            "advantage/min": min(adv, default=None),
            "advantage/max": max(adv, default=None),
            "all_fail_frac": sum(g.successes(threshold) == 0 for g in groups) / max(P, 1),
            "all_correct_frac": sum(g.successes(threshold) == g.size for g in groups) / max(P, 1),
            "response_length/mean": sum(lengths) / max(len(lengths), 1),
            "response_length/min": min(lengths, default=0),
            "response_length/max": max(lengths, default=0),
            "truncated_frac": sum(not f for g in groups for f in g.finished) / max(len(rewards), 1),
            "verify/timeouts": statuses.count(VERIFY_TIMEOUT),
            "verify/no_answer": statuses.count(VERIFY_NO_ANSWER),
        }
        | {f"verify/failed/{k}": n for k, n in sorted(Counter(statuses).items()) if k not in _PLAIN_STATUSES}
        | reward_function_stats(groups)
    )


def reward_function_stats(groups: list[RolloutGroup]) -> dict:
    """TRL's ``rewards/NAME/mean`` and ``rewards/NAME/std`` of every reward function (``reward.function``; the groups'
    ``reward_parts``): the mean and the sample standard deviation (divides by N - 1, TRL's ``nanstd``) of the values
    the function gave over the P x G responses, leaving out those it gave none for (``None``, TRL's NaN). ``None``
    when it gave no value (std: fewer than two). Nothing when a domain grades.
    Hand-worked: values [1, None, 0, 1] -> mean 2/3, std sqrt(((1/3)^2 + (2/3)^2 + (1/3)^2) / 2) = sqrt(1/3)."""
    names = list(dict.fromkeys(name for g in groups for name in g.reward_parts))
    out: dict = {}
    for name in names:
        xs = [x for g in groups for x in g.reward_parts.get(name, []) if x is not None]
        out[f"rewards/{name}/mean"] = sum(xs) / len(xs) if xs else None
        out[f"rewards/{name}/std"] = statistics.stdev(xs) if len(xs) > 1 else None
    return out


def step_tokens(groups: list[RolloutGroup]) -> int:
    """Prompt + completion tokens of every response of ``groups`` (a prompt counts once per response, as in TRL's
    attention mask; the completion's stop token included)."""
    return sum(len(g.prompt_token_ids) + len(t) for g in groups for t in g.token_ids)


class TokenCounter:
    """TRL's ``num_tokens`` of every model: the prompt and completion tokens of all the responses it sampled so far in
    the run (:func:`step_tokens` summed over steps); carried in the checkpoints."""

    def __init__(self) -> None:
        self.totals: dict[str, int] = {}

    def add(self, groups: dict[str, list[RolloutGroup]]) -> dict:
        """Count a step's own groups of every model; returns ``{"M/num_tokens": total so far}``."""
        for name, gs in groups.items():
            self.totals[name] = self.totals.get(name, 0) + step_tokens(gs)
        return {f"{name}/num_tokens": self.totals[name] for name in groups}

    def state_dict(self) -> dict[str, int]:
        return dict(self.totals)

    def load_state_dict(self, state: Mapping[str, int] | None, records: list[dict]) -> None:
        """The totals of a checkpoint's ``state``; for a checkpoint written before graft counted them, the last of
        the metrics ``records`` that has them (the metrics file of the run, kept up to that checkpoint)."""
        if state is None:
            last: dict = next((r for r in reversed(records) if any(k.endswith("/num_tokens") for k in r)), {})
            state = {k.removesuffix("/num_tokens"): v for k, v in last.items() if k.endswith("/num_tokens") and v is not None}
        self.totals = {name: int(v) for name, v in state.items()}


def success_warnings(groups: dict[str, list[RolloutGroup]], threshold: float) -> list[str]:
    """One warning line per model whose rewards are not all 0 or 1 while none of them is above ``threshold``
    (``reward.success_threshold``): with a continuous reward every group of that model is all-fail, so the exchange
    treats it as failing everything. Hand-worked: rewards [0.3, 0.4] at 0.5 -> a line naming the model, 0.5 and 0.4;
    [0, 0] -> none (a 0/1 reward, nothing solved yet); [0.3, 0.6] -> none (0.6 succeeds)."""
    out = []
    for name, gs in groups.items():
        rewards = [r for g in gs for r in g.rewards]
        if rewards and any(r not in (0.0, 1.0) for r in rewards) and not any(succeeded(r, threshold) for r in rewards):
            out.append(
                f"warning: model {name}: no reward of step 1 is above reward.success_threshold={threshold:g} (the largest "
                f"is {max(rewards):g}; rewards are not all 0 or 1), so every group counts as all-fail; set "
                "reward.success_threshold to the reward that means solved"
            )
    return out


def in_group_reward_stats(rewards: list[list[float]]) -> dict:
    """TRL's in-group reward statistics of groups [P] of rewards [G] (``GRPOTrainer``, ``scale_rewards="group"``):
    ``reward_std``, the mean over groups of each group's SAMPLE standard deviation (divides by G - 1, as
    ``torch.std``; a group of one response counts 0), and ``frac_reward_zero_std``, the share of groups whose
    rewards are all equal (they get zero advantage). Both 0.0 without groups. Not ``reward/std``, which is the
    population spread over all P x G responses."""
    P = len(rewards)
    stds = [statistics.stdev(r) if len(r) > 1 else 0.0 for r in rewards]
    return {"reward_std": sum(stds) / max(P, 1), "frac_reward_zero_std": sum(len(set(r)) <= 1 for r in rewards) / max(P, 1)}


TRL_ALIASES = {
    "completions/mean_length": "response_length/mean",
    "completions/min_length": "response_length/min",
    "completions/max_length": "response_length/max",
    "completions/clipped_ratio": "truncated_frac",
    "clip_ratio/low_mean": "clip_frac/own_low",
    "clip_ratio/high_mean": "clip_frac/own_high",
}
"""TRL name -> the graft metric holding the same number (docs/metrics.md)."""


def trl_aliases(m: dict) -> dict:
    """The same numbers under TRL's names, for the graft keys present in ``m`` (one model's, unprefixed):
    :data:`TRL_ALIASES`, and ``clip_ratio/region_mean`` = own low + own high (the two are disjoint: low needs
    a negative advantage, high a positive one). The clip ratios are over the model's own rows, the only rows
    TRL trains on; peer rows keep their graft names (``clip_frac/peer_*``)."""
    out = {trl: m[key] for trl, key in TRL_ALIASES.items() if key in m}
    if "clip_ratio/low_mean" in out and "clip_ratio/high_mean" in out:
        out["clip_ratio/region_mean"] = out["clip_ratio/low_mean"] + out["clip_ratio/high_mean"]
    return out


_PLAIN_STATUSES = (VERIFY_OK, VERIFY_NO_ANSWER, VERIFY_TIMEOUT, VERIFY_ERROR)
"""Statuses every domain has; any other is a domain's kind of failure (code: ``wrong_answer``, ``syntax``,
``program_timeout``, ...), counted per step as ``verify/failed/KIND``."""


def completion_rows(step: int, groups: dict[str, list[RolloutGroup]], k: int) -> dict[str, list[dict]]:
    """What the trackers show of a step's completions: for each model, the first response of its first
    ``k`` own groups (prompts in the step's order; no random draw), with problem, reward and advantage."""
    return {
        name: [
            {
                "step": step,
                "model": name,
                "prompt_id": g.prompt_id,
                "prompt": g.problem,
                "completion": g.responses[0],
                "reward": g.rewards[0],
                "advantage": g.advantages[0] if g.advantages else None,
            }
            for g in gs[:k]
            if g.size
        ]
        for name, gs in groups.items()
        if k > 0
    }


def prefixed(prefix: str, metrics: dict) -> dict:
    return {f"{prefix}/{k}": v for k, v in metrics.items()}


def check_run_dir(run_dir: str | os.PathLike) -> None:
    """Refuse a ``run_dir`` that cannot be created or written, without creating anything.

    The folder itself, or its nearest existing parent, must be a writable folder (a path under a
    regular file, a read-only file system or missing permissions are refused here, before any
    model is loaded). Raises :class:`OutputError` naming ``run_dir``.
    """
    p = Path(run_dir).expanduser()
    if p.exists() and not p.is_dir():
        raise OutputError(f"run_dir {p}: is a file, not a folder")
    probe = p
    while not probe.exists():
        parent = probe.parent
        if parent == probe:
            break
        probe = parent
    if not probe.is_dir():
        raise OutputError(f"run_dir {p}: cannot be created because {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        what = "cannot be written" if probe == p else f"cannot be created: no write permission in {probe}"
        raise OutputError(f"run_dir {p}: {what}")
    if p.is_dir():
        for name in ("metrics.jsonl", "audit.jsonl", "config.yaml", "checkpoints", "trajectories"):
            q = p / name
            if q.exists() and not os.access(q, os.W_OK):
                raise OutputError(f"run_dir {p}: {q} cannot be written")


class JsonlWriter:
    """Append-only JSONL file; each line is flushed and fsynced, so a kill loses at most the line in flight."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: Mapping[str, Any]) -> None:
        """Append ``record`` as one line (NaN/inf at any depth -> null; see :func:`json_safe`).
        A full disk or a permission problem is an :class:`OutputError` naming the file."""
        line = dumps_json(record)
        with writing(self.path), open(self.path, "a") as f:
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
        with writing(self.path):
            tmp.write_text("".join(line + "\n" for line in keep))
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


def _num(v, spec: str) -> str:
    """``v`` formatted with ``spec``; ``-`` when missing (``None``: e.g. entropy with ``rollout.engine: hf-cb|vllm``)."""
    return "-" if v is None else format(v, spec)


def console_line(step: int, steps: int, m: dict, models: list[str]) -> str:
    """The one line per step: per model reward, loss, gradient norm, sampler entropy, all-fail share and peer
    responses; per direction the admitted responses; the step's seconds (docs/metrics.md)."""
    parts = [f"step {step}/{steps}"]
    for name in models:
        v = {k: m.get(f"{name}/{k}") for k in ("reward/mean", "loss", "grad_norm", "entropy/mean", "all_fail_frac")}
        parts.append(
            f"{name}: reward {_num(v['reward/mean'], '.3f')} loss {_num(v['loss'], '.4g')} "
            f"grad {_num(v['grad_norm'], '.3g')} entropy {_num(v['entropy/mean'], '.3f')} "
            f"all-fail {_num(v['all_fail_frac'], '.2f')} peer {m.get(f'{name}/peer_responses', 0)}"
        )
    ex = [k for k in m if k.endswith("/admitted") and k.startswith("exchange/")]
    for k in ex:
        parts.append(f"{k.split('/')[1]} admitted {m[k]}")
    parts.append(f"{m.get('time/step_s', 0):.1f}s")
    return " | ".join(parts)
