"""Issue 39: one rollout phase of a config's models, one after the other vs side by side with claiming, alternating.

    python benchmarks/issue39_claim.py [--config configs/default.yaml] [--reps 3] [--out FILE.json]

Sets the config's run up once, samples its first batch of prompts, and runs the trainer's own rollout phase
(:func:`graft.trainer.loop.rollout_phase`, step 1's seeds) alternately as configured (``threads_per_model`` empty:
each model in turn on ``threads`` threads) and with ``threads_per_model={rollout: 1}`` and ``threads_claim_freed=true``
(each model on one thread of its own, the one still sampling taking the other's thread once it is free), after one
untimed warm-up phase. Prints seconds and tokens generated per repetition: equal token counts say both ways sampled
the same responses.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from graft.bench.common import environment
from graft.bench.runs import close_run
from graft.config import load_config
from graft.trainer.loop import rollout_phase, setup

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(REPO / "configs/default.yaml"))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(args.config, ["progress=false", "resume=false", f"run_dir={tmp}/run"])
        torch.set_num_threads(cfg.threads)
        claim = dataclasses.replace(cfg, threads_per_model={"rollout": 1}, threads_claim_freed=True)
        sides = {"in turn": cfg, "side by side": claim}
        run = setup(cfg)
        try:
            prompts, _ = run.sampler.next_batch()
            rollout_phase(run, prompts, 1)  # warm-up
            seconds: dict[str, list[float]] = {k: [] for k in sides}
            tokens: dict[str, list[int]] = {k: [] for k in sides}
            for _ in range(args.reps):
                for side, c in sides.items():
                    run.cfg = c
                    t0 = time.perf_counter()
                    groups, _ = rollout_phase(run, prompts, 1)
                    seconds[side].append(time.perf_counter() - t0)
                    torch.set_num_threads(cfg.threads)
                    tokens[side].append(sum(len(t) for gs in groups.values() for g in gs for t in g.token_ids))
        finally:
            close_run(run)
    ratio = statistics.median(seconds["in turn"]) / statistics.median(seconds["side by side"])
    print(f"{args.config}: rollout phase, {args.reps} alternating repetitions")
    for side in sides:
        print(f"  {side}: s {', '.join(f'{s:.2f}' for s in seconds[side])}; tokens {tokens[side]}")
    print(f"  in turn / side by side (medians): {ratio:.3f}x")
    if args.out:
        result = {"config": args.config, "environment": environment(), "seconds": seconds, "tokens": tokens, "ratio": ratio}
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
