"""``graft bench rollout-batch``: each model's rollout at several generation batch sizes, same prompts and seeds.

    graft bench rollout-batch [--sizes 64,128] [--config CFG] [--reps 2] [--out FILE.json] [key=value ...]

One Run of the config (overrides after the flags) draws step 1's prompts once. Then, alternating the sizes within
each repetition, every model samples those prompts (``Learner.rollout``: the engine, seeds, templates and stop strings
of training) with each ``rollout.batch_size``. Prints seconds and generated tokens per second per model and size
(medians), and how many of the responses are token for token those of the first size: per-sample seeds make the
samples independent of the batching, so only a matmul that rounds differently at another row count can change one.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time

import torch

from graft.bench.common import cpu_model
from graft.bench.runs import close_run, default_config_path, write_results
from graft.config import Config, ConfigError, load_config
from graft.console import say
from graft.trainer import loop


def parse_sizes(text: str) -> list[int]:
    """``--sizes``: distinct positive batch sizes, comma-separated, in the order given."""
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes):
        raise ConfigError(f"--sizes {text!r}: give distinct positive batch sizes, comma-separated (e.g. 64,128)")
    return sizes


def measure(run: loop.Run, cfg: Config, sizes: list[int], reps: int) -> dict:
    """``{model: {size: [row per repetition]}}``, sizes alternating within each repetition."""
    raw: dict = {}
    first: dict = {}
    prompts, _ = run.sampler.next_batch()
    for rep in range(reps):
        for size in sizes:
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
                say(f"rep {rep + 1} batch {size} {name}: {row}")
    return raw


def table(raw: dict, first_size: int) -> list[str]:
    """The markdown table: per model and size, the median seconds, tokens/s and speed-up against the first size."""
    lines = [
        f"| model | batch | seconds | generated tokens | tok/s | speed-up vs {first_size} | responses as at {first_size} |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, by_size in raw.items():
        base = statistics.median(r["seconds"] for r in by_size[str(first_size)])
        for size, rows in by_size.items():
            sec = statistics.median(r["seconds"] for r in rows)
            gen = rows[-1]["generated"]
            same = min(r["same_as_first_size"] for r in rows)
            lines.append(
                f"| {name} | {size} | {sec:.2f} | {gen} | {gen / sec:.1f} | {base / sec:.2f}x | {same}/{rows[-1]['responses']} |"
            )
    return lines


def run(args: argparse.Namespace) -> int:
    """``graft bench rollout-batch``: the sizes' rollouts, a table on stdout, every repetition in ``--out``."""
    sizes = parse_sizes(args.sizes)
    if args.reps < 1:
        raise ConfigError(f"--reps must be >= 1, got {args.reps}")
    config = str(args.config or default_config_path())
    with tempfile.TemporaryDirectory(prefix="graft-rollout-batch-") as tmp:
        cfg = load_config(config, ["progress=false", "resume=false", f"run_dir={tmp}/run", *args.overrides])
        live = loop.setup(cfg)
        try:
            raw = measure(live, cfg, sizes, args.reps)
        finally:
            close_run(live)
    print(
        f"torch {torch.__version__}, {cpu_model()}, {torch.get_num_threads()} threads, {args.reps} reps; config {config} "
        f"{args.overrides}; {cfg.batch_prompts} prompts x {cfg.rollout.n} samples"
    )
    print("\n".join(table(raw, sizes[0])))
    write_results(args.out, raw, args, cpu=cpu_model(), torch=torch.__version__)
    return 0
