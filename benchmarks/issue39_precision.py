"""Issue 39: the update phase in fp32 and under ``models.I.autocast=bfloat16``, at equal work.

    python benchmarks/issue39_precision.py [--config FILE] [--reps 2] [--out FILE.json] [key=value ...]

One Run of the config (``threads=2``, ``update.recompute_old_logprobs=true``; overrides after the flags) samples,
scores and exchanges step 1 once (fp32 sampler). Then, alternating fp32, bf16, fp32, bf16, ..., every model's update of
that step (``loop.update_model``: its minibatches, micro-batches and AdamW steps) runs on those same groups from the
same starting weights and optimiser state (restored before each run), after recomputing the behaviour log-probs in the
precision under test (so the first ratio is 1 in both). Prints seconds per model and precision (medians), the update
tokens, and the update's ratio and loss (what the precision changed in the result).
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

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(default_config_path()))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(2)
    raw: dict = {p: {} for p in PRECISIONS}
    with tempfile.TemporaryDirectory() as tmp:
        fixed = ["threads=2", "progress=false", f"run_dir={tmp}/run", "update.recompute_old_logprobs=true"]
        cfg = load_config(args.config, [*fixed, *args.overrides])
        run = loop.setup(cfg)
        try:
            _, train = first_step(run)
            learners = run.learners
            policies = {n: lr.workers.worker.policy for n, lr in learners.items()}
            start = snapshot_models(run)
            for rep in range(args.reps):
                for prec, dtype in PRECISIONS.items():
                    for n, pol in policies.items():
                        restore_model(run, n, start)
                        pol.autocast, pol._compute = dtype, None
                        own = [g for g in train[n] if not g.is_peer]
                        learners[n].recompute_old_logprobs(own, cfg.update, cfg.rollout.temperature)
                        t0 = time.perf_counter()
                        m = loop.update_model(run, n, train[n], 1)
                        row = {"seconds": time.perf_counter() - t0} | {
                            k: m.get(k) for k in ("tokens/update", "ratio/mean", "loss")
                        }
                        raw[prec].setdefault(n, []).append(row)
                        print(f"rep {rep + 1} {prec} {n}: {row}", file=sys.stderr, flush=True)
        finally:
            for pol in policies.values():
                pol.autocast, pol._compute = None, None
            close_run(run)
    print(f"torch {torch.__version__}, {cpu_model()}, 2 threads, {args.reps} reps; config {args.config} {args.overrides}")
    print("| model | update tokens | fp32 s | bf16 s | fp32 / bf16 | loss fp32 / bf16 | ratio mean fp32 / bf16 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for n in raw["fp32"]:
        a, b = raw["fp32"][n], raw["bf16"][n]
        sa, sb = statistics.median(r["seconds"] for r in a), statistics.median(r["seconds"] for r in b)
        print(
            f"| {n} | {a[0]['tokens/update']} | {sa:.2f} | {sb:.2f} | {sa / sb:.2f}x | {a[0]['loss']:.4f} / {b[0]['loss']:.4f} | "
            f"{a[0]['ratio/mean']:.4f} / {b[0]['ratio/mean']:.4f} |"
        )
    write_results(args.out, raw, args, cpu=cpu_model(), torch=torch.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
