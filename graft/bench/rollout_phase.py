"""``graft bench rollout-phase``: one rollout phase of a config's models two ways, alternating, in one process.

    graft bench rollout-phase [--compare claim|prefix] [--config CFG] [--reps 3] [--out FILE.json] [key=value ...]

Sets the config's run up once, samples its first batch of prompts, and runs the trainer's own rollout phase
(:func:`graft.trainer.loop.rollout_phase`, step 1's seeds) alternately the two ways ``--compare`` names, after one
untimed warm-up phase:

- ``claim`` (default): as configured with ``threads_per_model`` empty (each model in turn on ``threads`` threads) vs
  ``threads_per_model={rollout: 1}`` and ``threads_claim_freed=true`` (each model on one thread of its own, the one
  still sampling taking the other's thread once it is free).
- ``prefix``: every model's ``common_prefix`` off vs on (the prompts' shared template and worked examples forwarded
  once per generation batch), everything else as configured.

Prints seconds and tokens generated per repetition, and how many responses of the last repetition are token for
token the same on both sides: a change that reorders float sums may move a sampled token at a sampling-CDF boundary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from graft.bench.common import environment
from graft.bench.runs import close_run, default_config_path
from graft.config import ConfigError, load_config
from graft.trainer.loop import Run, rollout_phase, setup


def two_ways(compare: str, run: Run) -> dict[str, Callable[[], None]]:
    """The two ways, each as what makes ``run`` go that way."""
    cfg = run.cfg

    def config(c) -> Callable[[], None]:
        return lambda: setattr(run, "cfg", c)

    def prefix(on: bool) -> Callable[[], None]:
        def apply() -> None:
            for learner in run.learners.values():
                learner.policy.common_prefix = on

        return apply

    if compare == "claim":
        claim = dataclasses.replace(cfg, threads_per_model={"rollout": 1}, threads_claim_freed=True)
        return {"in turn": config(dataclasses.replace(cfg, threads_per_model={})), "side by side": config(claim)}
    return {"prefix off": prefix(False), "prefix on": prefix(True)}


def alternate(run: Run, sides: dict[str, Callable[[], None]], reps: int) -> tuple[dict, dict, dict]:
    """``reps`` timed rollout phases per side, alternating, after one warm-up: seconds and tokens per repetition,
    and every response of each side's last repetition."""
    threads = torch.get_num_threads()
    prompts, _ = run.sampler.next_batch()
    rollout_phase(run, prompts, 1)  # warm-up
    seconds: dict[str, list[float]] = {k: [] for k in sides}
    tokens: dict[str, list[int]] = {k: [] for k in sides}
    last = {}
    for _ in range(reps):
        for side, apply in sides.items():
            apply()
            t0 = time.perf_counter()
            groups, _ = rollout_phase(run, prompts, 1)
            seconds[side].append(time.perf_counter() - t0)
            torch.set_num_threads(threads)
            last[side] = [list(t) for gs in groups.values() for g in gs for t in g.token_ids]
            tokens[side].append(sum(len(t) for t in last[side]))
    return seconds, tokens, last


def run(args: argparse.Namespace) -> int:
    """``graft bench rollout-phase``: the two ways, a summary on stdout, the repetitions in ``--out``."""
    if args.reps < 1:
        raise ConfigError(f"--reps must be >= 1, got {args.reps}")
    config = str(args.config or default_config_path())
    with tempfile.TemporaryDirectory(prefix="graft-rollout-phase-") as tmp:
        cfg = load_config(config, [*args.overrides, "progress=false", "resume=false", f"run_dir={tmp}/run"])
        live = setup(cfg)
        try:
            sides = two_ways(args.compare, live)
            seconds, tokens, last = alternate(live, sides, args.reps)
        finally:
            close_run(live)
    a, b = sides
    same = sum(x == y for x, y in zip(last[a], last[b], strict=True))
    ratio = statistics.median(seconds[a]) / statistics.median(seconds[b])
    print(f"{config} {args.overrides}: rollout phase, {args.reps} alternating repetitions, {args.compare}")
    for side in sides:
        print(f"  {side}: s {', '.join(f'{s:.2f}' for s in seconds[side])}; tokens {tokens[side]}")
    print(f"  responses token for token the same: {same} of {len(last[a])}")
    print(f"  {a} / {b} (medians): {ratio:.3f}x")
    if args.out:
        result = {
            "config": config,
            "overrides": args.overrides,
            "compare": args.compare,
            "environment": environment(),
            "seconds": seconds,
            "tokens": tokens,
            "same_responses": [same, len(last[a])],
            "ratio": ratio,
        }
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0
