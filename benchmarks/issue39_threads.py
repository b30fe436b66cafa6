"""Issue 39: one model after the other on 2 threads vs side by side on 1 thread each, per phase, real default steps.

    python benchmarks/issue39_threads.py [--reps 3] [--variants seq2,par1,roll1,upd1] [--warmup] [--out FILE] [key=value ...]

Run on two idle cores. One Run of ``configs/default.yaml`` (``threads=2``; overrides after the flags). In every
repetition each variant takes one training step on the same prompts (the sampler rewound to the same state) at the
same step index (the same sampling seeds), variants alternating (A, B, C, D, A, B, ...):

- ``seq2``: one model after the other, each on 2 threads (``threads_per_model`` empty: the default today);
- ``par1``: side by side, one thread each, in rollout and update (``threads_per_model={rollout: 1, update: 1}``);
- ``roll1``: rollout side by side (1 thread each), update one after the other on 2;
- ``upd1``: rollout one after the other on 2, update side by side (1 thread each);
- ``claim``: ``par1`` with ``threads_claim_freed=true`` (the slower model takes the freed thread).

A thread count rounds matmuls differently, so from the first token that flips the variants sample different
responses of different lengths: beside the step and phase seconds the bench prints tokens per second of each phase
(generated tokens over rollout seconds, update tokens over update seconds), the work-independent figure. The
weights move by one update per step (the default learning rate), the same in every variant.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time

import torch
from issue39_commits import step_figures  # the same per-step figures (benchmarks/ is sys.path[0])

from graft.bench.common import cpu_model
from graft.bench.runs import close_run, default_config_path, rewound_step
from graft.config import load_config
from graft.trainer.loop import setup

VARIANTS = {
    "seq2": {"threads_per_model": {}},
    "par1": {"threads_per_model": {"rollout": 1, "update": 1}},
    "roll1": {"threads_per_model": {"rollout": 1}},
    "upd1": {"threads_per_model": {"update": 1}},
    "claim": {"threads_per_model": {"rollout": 1, "update": 1}, "threads_claim_freed": True},
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--variants", default="seq2,par1,roll1,upd1")
    ap.add_argument("--out", default=None)
    ap.add_argument("--warmup", action="store_true", help="one untimed step first (the first step pays allocations)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    variants = args.variants.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(str(default_config_path()), ["threads=2", "progress=false", f"run_dir={tmp}/run", *args.overrides])
        run = setup(cfg)
        state = run.sampler.state_dict()
        raw: dict[str, list[dict]] = {v: [] for v in variants}
        try:
            if args.warmup:
                rewound_step(run, state, 1)
            for rep in range(args.reps):
                for v in variants:
                    run.cfg = dataclasses.replace(cfg, **VARIANTS[v])
                    torch.set_num_threads(cfg.threads or 2)
                    t0 = time.perf_counter()
                    raw[v].append(step_figures(rewound_step(run, state, 1)))
                    print(f"rep {rep + 1} {v}: {raw[v][-1]} ({time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)
        finally:
            close_run(run)
    med = {v: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for v, rs in raw.items()}
    base = med[variants[0]]
    print(f"torch {torch.__version__}, {cpu_model()}, {args.reps} reps, config {default_config_path().name} {args.overrides}")
    print(f"| variant | step s | rollout s | update s | generated tok/s | update tok/s | step vs {variants[0]} |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for v, x in med.items():
        print(
            f"| {v} | {x['step_s']:.1f} | {x['rollout_s']:.1f} | {x['update_s']:.1f} | {x['gen_tok_per_s']:.1f} | "
            f"{x['upd_tok_per_s']:.1f} | {base['step_s'] / x['step_s']:.2f}x |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"medians": med, "raw": raw, "overrides": args.overrides, "reps": args.reps}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
