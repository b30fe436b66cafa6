"""Part (a) of ``graft bench``: graft's GRPO step against TRL's ``GRPOTrainer`` on one model, same
prompts, alternating (TRL's side is skipped, with the reason, where TRL is missing or cannot match)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from graft.bench.common import alternate, package_version, progress, steps_line, summarize
from graft.bench.runs import close_run, model_entry, rewound_step, run_shapes, single_model_config, step_row
from graft.bench.trl_settings import (
    TRL_ADV_EPS,
    TRL_DIFFERENCES,
    TRL_MATCHED,
    TrlUnsupported,
    micro_batch_difference,
    trl_batch_problem,
    trl_unavailable_reason,
)
from graft.config import Config, ModelConfig
from graft.trainer.loop import setup

GRAFT_STEP_KEYS = (
    "step_s",
    "rollout_s",
    "score_s",
    "update_s",
    "tokens_generated",
    "rollout_tokens_per_s",
    "tokens_update",
    "reward_mean",
    "peak_rss_gb",
    "rollout_gflops",
    "update_gflops",
    "step_gflops",
)
TRL_STEP_KEYS = (
    "step_s",
    "rollout_s",
    "score_s",
    "update_s",
    "train_call_s",
    "tokens_generated",
    "rollout_tokens_per_s",
    "reward_mean",
    "peak_rss_gb",
)


def rollout_rate(row: dict) -> dict:
    """``row`` with ``rollout_tokens_per_s`` = tokens generated / rollout seconds (None without a rollout time)."""
    sec = row.get("rollout_s")
    return row | {"rollout_tokens_per_s": row["tokens_generated"] / sec if sec else None}


def _trl_side(cfg: Config, entry: ModelConfig, prompts, run, out_dir: Path):
    """``(TrlBench, None)`` for TRL's side, or ``(None, why it is skipped)``."""
    reason = trl_unavailable_reason() or trl_batch_problem(cfg)
    if reason is not None:
        return None, reason
    from graft.bench.trl_trainer import TrlBench  # deferred: imports the optional TRL (pip install 'graft[bench]')

    progress(f"(a) loading {entry.path} for TRL {package_version('trl')}")
    try:
        return TrlBench(cfg, entry, prompts, run.grader, run.learners[entry.name], out_dir), None
    except TrlUnsupported as e:
        return None, str(e)


def bench_a(base: Config, model: str, reps: int, run_root: Path) -> dict:
    """Part (a) on ``model``: graft's step on rewound prompts, alternating with TRL's step where it runs."""
    entry = dataclasses.replace(model_entry(base, model), dtype="float32")
    cfg = single_model_config(base, entry, run_root / "a", adv_eps=TRL_ADV_EPS)
    progress(f"(a) loading {model} for graft")
    run = setup(cfg)
    state = run.sampler.state_dict()
    prompts, _ = run.sampler.next_batch()
    out: dict = {
        "model": model,
        "name": entry.name,
        "template": entry.template,
        "prompts": [p.id for p in prompts],
        "matched": list(TRL_MATCHED),
        "differences": list(TRL_DIFFERENCES) + micro_batch_difference(cfg),
    }
    try:
        trl, reason = _trl_side(cfg, entry, prompts, run, run_root / "a-trl")
        if trl is not None:
            out["prompt_ids_match"] = trl.prompt_ids_match
        shapes = run_shapes(run)
        sides = [("graft", lambda i: rollout_rate(step_row(rewound_step(run, state, i + 1), shapes)))]
        if trl is not None:
            sides.append(("trl", lambda i: rollout_rate(trl.step())))
        rows = alternate(reps, sides, "a", steps_line)
        out["graft"] = summarize(rows["graft"], GRAFT_STEP_KEYS) | {"raw": rows["graft"]}
        if trl is not None:
            out["trl"] = summarize(rows["trl"], TRL_STEP_KEYS) | {
                "raw": rows["trl"],
                "version": package_version("trl"),
                "config": trl.config_kwargs,
            }
        else:
            out["trl"] = {"skipped": reason}
            progress(f"(a) TRL side skipped: {reason}")
    finally:
        close_run(run)
    return out
