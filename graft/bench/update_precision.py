"""``graft bench update-precision``: the update phase in fp32 and under ``models.I.autocast=bfloat16``, at equal work.

    graft bench update-precision [--config CFG] [--reps 2] [--out FILE.json] [key=value ...]

One Run of the config (``update.recompute_old_logprobs=true``; overrides after the flags) samples, scores and
exchanges step 1 once (fp32 sampler). Then, alternating fp32, bf16, fp32, bf16, ..., every model's update of that step
(``loop.update_model``: its minibatches, micro-batches and AdamW steps) runs on those same groups from the same
starting weights and optimiser state (restored before each run), after recomputing the behaviour log-probs in the
precision under test (so the first ratio is 1 in both). Prints seconds per model and precision (medians), the update
tokens, and the update's ratio and loss (what the precision changed in the result).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from graft.bench.common import cpu_model
from graft.bench.runs import close_run, default_config_path, first_step, restore_model, snapshot_models, write_results
from graft.config import ConfigError, load_config
from graft.console import say
from graft.trainer import loop

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}
"""Name -> the autocast dtype of the update's forward passes (None: fp32, no autocast)."""


def measure(run: loop.Run, reps: int) -> dict:
    """``{precision: {model: [row per repetition]}}``, precisions alternating, every update from the same start."""
    raw: dict = {p: {} for p in PRECISIONS}
    _, train = first_step(run)
    cfg, learners = run.cfg, run.learners
    policies = {n: lr.workers.worker.policy for n, lr in learners.items()}
    start = snapshot_models(run)
    try:
        for rep in range(reps):
            for prec, dtype in PRECISIONS.items():
                for n, pol in policies.items():
                    restore_model(run, n, start)
                    pol.autocast, pol.scorer._compute = dtype, None
                    own = [g for g in train[n] if not g.is_peer]
                    learners[n].recompute_old_logprobs(own, cfg.update, cfg.rollout.temperature)
                    t0 = time.perf_counter()
                    m = loop.update_model(run, n, train[n], 1)
                    row = {"seconds": time.perf_counter() - t0} | {k: m.get(k) for k in ("tokens/update", "ratio/mean", "loss")}
                    raw[prec].setdefault(n, []).append(row)
                    say(f"rep {rep + 1} {prec} {n}: {row}")
    finally:
        for pol in policies.values():
            pol.autocast, pol.scorer._compute = None, None
    return raw


def table(raw: dict) -> list[str]:
    """The markdown table: per model, the median seconds of each precision, their ratio, and loss and mean ratio."""
    lines = [
        "| model | update tokens | fp32 s | bf16 s | fp32 / bf16 | loss fp32 / bf16 | ratio mean fp32 / bf16 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for n in raw["fp32"]:
        a, b = raw["fp32"][n], raw["bf16"][n]
        sa, sb = statistics.median(r["seconds"] for r in a), statistics.median(r["seconds"] for r in b)
        lines.append(
            f"| {n} | {a[0]['tokens/update']} | {sa:.2f} | {sb:.2f} | {sa / sb:.2f}x | {a[0]['loss']:.4f} / {b[0]['loss']:.4f} | "
            f"{a[0]['ratio/mean']:.4f} / {b[0]['ratio/mean']:.4f} |"
        )
    return lines


def run(args: argparse.Namespace) -> int:
    """``graft bench update-precision``: both precisions' updates, a table on stdout, every repetition in ``--out``."""
    if args.reps < 1:
        raise ConfigError(f"--reps must be >= 1, got {args.reps}")
    config = str(args.config or default_config_path())
    with tempfile.TemporaryDirectory(prefix="graft-update-precision-") as tmp:
        fixed = ["progress=false", "resume=false", f"run_dir={tmp}/run", "update.recompute_old_logprobs=true"]
        live = loop.setup(load_config(config, [*fixed, *args.overrides]))
        try:
            raw = measure(live, args.reps)
        finally:
            close_run(live)
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, {cpu_model()}, {threads} threads, {args.reps} reps; config {config} {args.overrides}")
    print("\n".join(table(raw)))
    write_results(args.out, raw, args, cpu=cpu_model(), torch=torch.__version__)
    return 0
