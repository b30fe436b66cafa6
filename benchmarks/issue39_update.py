"""Issue 39: the update at equal work with and without the head's in-place weight gradient and torch's fused AdamW.

    python benchmarks/issue39_update.py [--config FILE] [--reps 3] [--out FILE.json] [key=value ...]

One Run of the config (``threads=2``; overrides after the flags) samples, scores and exchanges step 1 once. Then every
model's update of that step (``loop.update_model``: its minibatches, micro-batches and AdamW steps) runs on those
same groups from the same starting weights and optimiser state (restored before each run), variants alternating:

- ``autograd``: the head's weight gradient returned to autograd (a [V, H] tensor per chunk, summed with the tied
  embedding's dense [V, H] gradient, then added into ``weight.grad``); AdamW's chunked single-tensor step;
- ``in-place``: ``Policy.accumulate_head_grad`` (the head adds into ``weight.grad`` in its matmul, the tied
  embedding adds only its tokens' rows); the single-tensor step;
- ``fused``: autograd's gradient; torch's fused AdamW kernel;
- ``both``: in-place and fused (today's default).

The first repetition is a warm-up (the heap grows; not counted). Prints the median seconds per model and variant,
each variant's ratio to ``autograd``, and how far its loss and parameters moved from ``autograd``'s (float rounding).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import torch

from graft.bench.common import cpu_model
from graft.bench.runs import close_run, default_config_path, first_step, restore_model, snapshot_models, write_results
from graft.config import load_config
from graft.trainer import loop

VARIANTS = {"autograd": (False, None), "in-place": (True, None), "fused": (False, True), "both": (True, True)}
"""name -> (``Policy.accumulate_head_grad``, AdamW's ``fused`` flag)."""


def _param_sum(pol) -> float:
    return sum(float(p.detach().double().sum()) for p in pol.trainable_parameters())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(default_config_path()))
    ap.add_argument("--reps", type=int, default=3, help="counted repetitions (after one warm-up)")
    ap.add_argument("--out", default=None)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(2)
    raw: dict = {v: {} for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(args.config, ["threads=2", "progress=false", f"run_dir={tmp}/run", *args.overrides])
        run = loop.setup(cfg)
        policies = {n: lr.workers.worker.policy for n, lr in run.learners.items()}
        try:
            _, train = first_step(run)
            start = snapshot_models(run)
            for rep in range(args.reps + 1):
                for variant, (accumulate, fused) in VARIANTS.items():
                    for n, pol in policies.items():
                        restore_model(run, n, start)
                        for group in run.learners[n].workers.worker.optimizer.param_groups:
                            group["fused"] = fused
                        pol.accumulate_head_grad = accumulate
                        t0 = time.perf_counter()
                        m = loop.update_model(run, n, train[n], 1)
                        row = {"seconds": time.perf_counter() - t0, "warm_up": rep == 0, "param_sum": _param_sum(pol)}
                        row |= {k: m.get(k) for k in ("tokens/update", "loss")}
                        raw[variant].setdefault(n, []).append(row)
                        print(f"rep {rep} {variant} {n}: {row}", file=sys.stderr, flush=True)
        finally:
            for pol in policies.values():
                pol.accumulate_head_grad = True
            close_run(run)
    print(f"torch {torch.__version__}, {cpu_model()}, 2 threads, {args.reps} reps after a warm-up; config {args.config}")
    print("| model | variant | update tokens | median s | autograd / variant | loss - autograd's | param sum - autograd's |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for n in raw["autograd"]:
        counted = {v: [r for r in raw[v][n] if not r["warm_up"]] for v in VARIANTS}
        base = statistics.median(r["seconds"] for r in counted["autograd"])
        ref = counted["autograd"][0]
        for v, rows in counted.items():
            s = statistics.median(r["seconds"] for r in rows)
            print(
                f"| {n} | {v} | {rows[0]['tokens/update']} | {s:.2f} | {base / s:.2f}x | "
                f"{rows[0]['loss'] - ref['loss']:.1e} | {rows[0]['param_sum'] - ref['param_sum']:.1e} |"
            )
    write_results(args.out, raw, args, cpu=cpu_model(), torch=torch.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
