"""``graft bench`` without a measurement's name: the comparison with references, its input checks, the parts in
order, and the output files (its parser and the dispatch: :mod:`graft.bench.args`)."""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path

import torch

from graft.bench.common import PARTS, clean, environment, progress
from graft.bench.flops import matmul_peak_gflops
from graft.bench.graft_vs_grpo import bench_c
from graft.bench.report import markdown
from graft.bench.rollout_vs_generate import bench_b
from graft.bench.runs import default_config_path
from graft.bench.step_vs_trl import bench_a
from graft.config import Config, ConfigError, load_config
from graft.policy.loading import resolve_model_path


def parse_only(text: str) -> tuple[str, ...]:
    """The parts named by ``--only``, in canonical order."""
    parts = tuple(p.strip().lower() for p in text.split(",") if p.strip())
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise ConfigError(f"--only {text!r}: give a comma-separated subset of {','.join(PARTS)}")
    return tuple(p for p in PARTS if p in parts)


def bench_config(args: argparse.Namespace, run_root: Path) -> Config:
    """The config every part starts from: ``--config`` + overrides + the bench's sizes and switches."""
    path = args.config or default_config_path()
    sets = [
        f"batch_prompts={args.prompts}",
        f"rollout.n={args.n}",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        "progress=false",
        "resume=false",
        f"run_dir={run_root / 'base'}",
    ]
    if args.threads is not None:
        sets.append(f"threads={args.threads}")
    if args.device is not None:
        sets.append(f"device={args.device}")
    return load_config(path, [*args.overrides, *sets])


def models_for_b(args: argparse.Namespace, cfg: Config) -> tuple[str, ...]:
    """The models of part (b): ``--models``, else the config's."""
    if args.models:
        return tuple(m.strip() for m in args.models.split(",") if m.strip())
    return tuple(m.path for m in cfg.models)


def check_inputs(args: argparse.Namespace, cfg: Config, parts: tuple[str, ...]) -> None:
    """Reject bad input before any model is loaded."""
    if args.reps < 1:
        raise ConfigError(f"--reps must be >= 1, got {args.reps}")
    if args.max_tries < 1:
        raise ConfigError(f"--max-tries must be >= 1, got {args.max_tries}")
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise ConfigError(f"--out {args.out} exists and is not a folder")
    paths = ([args.model] if "a" in parts else []) + (list(models_for_b(args, cfg)) if "b" in parts else [])
    for p in paths:
        resolve_model_path(p)
    if "c" in parts and len(cfg.models) != 2:  # a stored-peer config (exchange.kind=stored) trains one model
        raise ConfigError(
            "part c compares GRAFT with GRPO on a pair: the config needs exactly two models (use --only a,b otherwise)"
        )


def _settings(args: argparse.Namespace, base: Config, parts: tuple[str, ...]) -> dict:
    """The ``settings`` block of ``bench.json``."""
    return {
        "parts": list(parts),
        "reps": args.reps,
        "model": args.model,
        "models": list(models_for_b(args, base)) if "b" in parts else [],
        "config": str(args.config or default_config_path()),
        "overrides": args.overrides,
        "prompts": args.prompts,
        "n": args.n,
        "max_new_tokens": args.max_new_tokens,
        "threads": base.threads,
        "device": base.device,
        "keep_balance": args.keep_balance,
        "max_tries": args.max_tries,
        "temperature": base.rollout.temperature,
        "top_p": base.rollout.top_p,
        "num_minibatches": base.update.num_minibatches,
        "micro_batch_size": base.update.micro_batch_size,
    }


def _run_parts(args: argparse.Namespace, base: Config, parts: tuple[str, ...], run_root: Path, result: dict) -> None:
    """Run the chosen parts in order into ``result``, with the wall clock of them all."""
    t0 = time.perf_counter()
    if "a" in parts:
        result["a"] = bench_a(base, args.model, args.reps, run_root)
        gc.collect()
    if "b" in parts:
        result["b"] = bench_b(base, models_for_b(args, base), args.reps, run_root)
        gc.collect()
    if "c" in parts:
        result["c"] = bench_c(base, args.reps, run_root, args.keep_balance, args.max_tries)
    result["wall_clock_s"] = time.perf_counter() - t0


def _write(out: Path, result: dict, md: str) -> None:
    """``bench.json`` and ``bench.md`` in folder ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=2, allow_nan=False))
    (out / "bench.md").write_text(md)
    progress(f"wrote {out / 'bench.json'} and {out / 'bench.md'}")


def run(args: argparse.Namespace) -> int:
    """``graft bench``: the chosen parts, the markdown on stdout, and ``--out``'s files."""
    parts = parse_only(args.only)
    with tempfile.TemporaryDirectory(prefix="graft-bench-") as tmp:
        run_root = Path(tmp)
        base = bench_config(args, run_root)
        check_inputs(args, base, parts)
        if base.threads:
            torch.set_num_threads(base.threads)
        result: dict = {
            "settings": _settings(args, base, parts),
            "environment": environment() | {"matmul_peak_gflops": matmul_peak_gflops()},
        }
        _run_parts(args, base, parts, run_root, result)
    result = clean(result)
    md = markdown(result)
    if args.out:
        _write(Path(args.out), result, md)
    print(md)
    return 0
