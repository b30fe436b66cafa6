"""Issue 39: one model's rollout at several generation batch sizes (``rollout.batch_size``), same prompts and seeds.

    python benchmarks/issue39_batch.py [--config FILE] [--sizes 64 128] [--reps 2] [--out FILE.json] [key=value ...]

One Run of the config (``threads=2``; overrides after the flags) draws step 1's prompts once. Then, alternating the
sizes within each repetition, every model samples those prompts (``Learner.rollout``: the engine, seeds, templates and
stop strings of training) with each batch size. Prints seconds and generated tokens per second per model and size
(medians), and how many of the responses are token for token those of the first size: per-sample seeds make the
samples independent of the batching, so only a matmul that rounds differently at another row count can change one.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time

import torch

from graft.bench.common import cpu_model
from graft.bench.runs import close_run, default_config_path, write_results
from graft.config import load_config
from graft.trainer import loop


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(default_config_path()))
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(2)
    raw: dict = {}
    first: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(args.config, ["threads=2", "progress=false", f"run_dir={tmp}/run", *args.overrides])
        run = loop.setup(cfg)
        try:
            prompts, _ = run.sampler.next_batch()
            for rep in range(args.reps):
                for size in args.sizes:
                    rc = dataclasses.replace(cfg.rollout, batch_size=size)
                    for name, learner in run.learners.items():
                        t0 = time.perf_counter()
                        groups, m = learner.rollout(prompts, rc, 1, cfg.seed)
                        seconds = time.perf_counter() - t0
                        tokens = [t for g in groups for t in g.token_ids]
                        ref = first.setdefault(name, tokens)
                        row = {
                            "seconds": seconds,
                            "generated": m["tokens/generated"],
                            "same_as_first_size": sum(a == b for a, b in zip(ref, tokens, strict=True)),
                            "responses": len(tokens),
                        }
                        raw.setdefault(name, {}).setdefault(str(size), []).append(row)
                        print(f"rep {rep + 1} batch {size} {name}: {row}", file=sys.stderr, flush=True)
        finally:
            close_run(run)
    print(
        f"torch {torch.__version__}, {cpu_model()}, 2 threads, {args.reps} reps; config {args.config} {args.overrides}; "
        f"{len(prompts)} prompts x {cfg.rollout.n} samples"
    )
    first_size = args.sizes[0]
    print(f"| model | batch | seconds | generated tokens | tok/s | speed-up vs {first_size} | responses as at {first_size} |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, by_size in raw.items():
        base = statistics.median(r["seconds"] for r in by_size[str(args.sizes[0])])
        for size, rows in by_size.items():
            sec = statistics.median(r["seconds"] for r in rows)
            gen = rows[-1]["generated"]
            same = min(r["same_as_first_size"] for r in rows)
            total = rows[-1]["responses"]
            print(f"| {name} | {size} | {sec:.2f} | {gen} | {gen / sec:.1f} | {base / sec:.2f}x | {same}/{total} |")
    write_results(args.out, raw, args, cpu=cpu_model(), torch=torch.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
