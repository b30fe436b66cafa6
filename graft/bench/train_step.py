"""``graft bench train-step``: whole training steps as ``graft train`` runs them, side by side on one machine.

    graft bench train-step [--old CHECKOUT] [--new CHECKOUT] [--recipe key=value ...] [--steps 4] [--reps 2]
        [--config CFG] [--out FILE.json] [key=value ...]

The sides: ``old`` (with ``--old``: another checkout's code), ``new`` (``--new``, default: the checkout this graft
was imported from) and ``recipe`` (with ``--recipe``: ``new``'s code with those overrides on top), at least two of
them. Each repetition runs ``graft train CONFIG steps=K`` once per side, alternating (old, new, recipe, old, ...) so
that a machine that drifts affects every side alike, each in its own process whose working directory and
``PYTHONPATH`` are that side's checkout (the module each side imported is printed). Every side reads the same config
file with the same seed, so step 1 trains on the same prompts with the same sampling seeds. Figures come from each
run's ``metrics.jsonl``: ``time/step_s`` and its phases, and tokens per second of rollout (generated tokens over
rollout seconds) and update (update tokens over update seconds) — the figures that do not depend on the work: a
change that legitimately reorders float sums flips sampled tokens, and from there the sides do different amounts of
work. Step 1 pays the first allocations and is reported apart; the medians are over steps 2..K of every repetition.
Ratios are the first side's over each other side's (> 1: that side is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from graft.bench.flops import ModelShape, matmul_peak_gflops, model_shape, phase_rates
from graft.bench.runs import default_config_path
from graft.config import ConfigError, load_config
from graft.console import say
from graft.errors import UserError
from graft.policy.loading import resolve_model_path

THIS_CHECKOUT = Path(__file__).resolve().parents[2]
"""The folder this graft is imported from (a checkout, or site-packages for an installed wheel)."""
FIELDS = ("step_s", "rollout_s", "update_s", "gen_tok_per_s", "upd_tok_per_s", "tokens_generated")
RATES = ("rollout_gflops", "update_gflops", "step_gflops")
KEPT = (
    "tokens/prompt",
    "tokens/generated",
    "tokens/forwarded",
    "tokens/update",
    "reward/mean",
    "ratio/mean",
    "ratio/max",
    "logprob_gap/mean_abs",
    "logprob_gap/max_abs",
    "clip_frac/own_low",
    "clip_frac/own_high",
    "grad_norm",
)
"""Per-model metrics each step keeps in the output JSON (token counts for the FLOP model; what the update saw)."""


def step_figures(m: dict) -> dict:
    """Seconds of one step and its phases, and tokens per second of rollout and update (summed over models)."""
    names = sorted({k.split("/")[0] for k in m if k.endswith("/tokens/generated")})
    total = lambda key: sum(m.get(f"{n}/{key}", 0) or 0 for n in names)  # noqa: E731
    return {
        "step_s": m["time/step_s"],
        "rollout_s": m["time/rollout_s"],
        "update_s": m["time/update_s"],
        "gen_tok_per_s": total("tokens/generated") / m["time/rollout_s"],
        "upd_tok_per_s": total("tokens/update") / m["time/update_s"],
        "tokens_generated": total("tokens/generated"),
    }


def sides(args: argparse.Namespace) -> dict[str, tuple[Path, list[str]]]:
    """Side name -> (the checkout whose code it runs, its extra overrides); refuses fewer than two sides."""
    new = Path(args.new or THIS_CHECKOUT).resolve()
    out: dict[str, tuple[Path, list[str]]] = {"old": (Path(args.old).resolve(), [])} if args.old else {}
    out["new"] = (new, [])
    if args.recipe:
        out["recipe"] = (new, list(args.recipe))
    if len(out) < 2:
        raise ConfigError("graft bench train-step compares sides: give --old CHECKOUT and/or --recipe key=value")
    for name, (code, _) in out.items():
        if not (code / "graft" / "__init__.py").is_file():
            raise ConfigError(f"--{'old' if name == 'old' else 'new'} {code}: no graft package in that folder")
    return out


def run_side(code: Path, config: Path, steps: int, run_dir: Path, overrides: list[str]) -> dict:
    """One ``graft train`` process on ``code``'s checkout; its per-step figures, wall seconds and imported module."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    module = subprocess.run(
        [sys.executable, "-c", "import graft; print(graft.__file__)"], cwd=code, env=env, capture_output=True, text=True
    ).stdout.strip()
    cmd = [sys.executable, "-m", "graft.cli", "-q", "train", str(config), f"steps={steps}", f"run_dir={run_dir}"]
    cmd += ["progress=false", f"checkpoint.save_every={steps + 1}", *overrides]
    t0 = time.perf_counter()
    rc = subprocess.run(cmd, cwd=code, env=env).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        raise UserError(f"graft train on {code} exited {rc} (its messages above): {' '.join(cmd[3:])}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    shutil.rmtree(run_dir)  # its final checkpoint holds every model and its optimiser state (GBs)
    steps_rows = [step_figures(r) | {"metrics": r} for r in rows if "time/step_s" in r]
    return {"module": module, "wall_s": wall, "steps": steps_rows}


def model_shapes(config: Path, overrides: list[str]) -> dict[str, ModelShape]:
    """The FLOP-relevant sizes of the config's models, from their configs alone (no weights loaded)."""
    shapes = {}
    for m in load_config(str(config), overrides).models:
        folder, gguf = resolve_model_path(m.path)
        cfg = AutoConfig.from_pretrained(folder, **({"gguf_file": gguf} if gguf else {}))
        with torch.device("meta"):
            shapes[m.name] = model_shape(AutoModelForCausalLM.from_config(cfg))
    return shapes


def add_rates(raw: dict[str, list[dict]], shapes: dict[str, ModelShape]) -> None:
    """Model GFLOP/s of every step's rollout, update and whole step (:mod:`graft.bench.flops`), from its token counts;
    None where a side's metrics lack a count the FLOP model needs (an older commit's)."""
    needed = ("tokens/prompt", "tokens/generated", "tokens/forwarded", "tokens/update")
    for runs in raw.values():
        for r in runs:
            for s in r["steps"]:
                m = s.pop("metrics")
                s["kept"] = {k: v for k, v in m.items() if k.split("/", 1)[-1] in KEPT}
                complete = all(f"{n}/{k}" in m for n in shapes for k in needed)
                rates = phase_rates(m, shapes)
                s |= {k: (rates[k] if complete else None) for k in RATES}


def _median(xs: list) -> float | None:
    return None if None in xs else statistics.median(xs)


def medians(runs: list[dict]) -> dict:
    """Medians over steps 2..K of every run, over the runs' step 1, and of the process wall clock."""
    later = [s for r in runs for s in r["steps"][1:]]
    first = [r["steps"][0] for r in runs]
    return {
        "steps_2_on": {k: _median([s[k] for s in later]) for k in FIELDS + RATES},
        "step_1": {k: _median([s[k] for s in first]) for k in FIELDS + RATES},
        "wall_s": statistics.median(r["wall_s"] for r in runs),
    }


def _cells(xs: list[float | None], fmt: str, unit: str = "") -> str:
    return " | ".join("–" if x is None else f"{x:{fmt}}{unit}" for x in xs)


def _over(a: float, b: float) -> float | None:
    """``a / b``; None where ``b`` is 0 (an update with no tokens to train)."""
    return a / b if b else None


def table(med: dict[str, dict], steps: int, peak: float) -> list[str]:
    """The markdown table of the medians: every side, and the first side's figures over each other side's."""
    base, *later = list(med)
    lines = [f"| medians | {' | '.join(med)} | {' | '.join(f'{base} / {s}' for s in later)} |"]
    lines.append("|---|" + "---:|" * (1 + 2 * len(later)))
    o = med[base]["steps_2_on"]
    for k in FIELDS:
        faster = k.endswith("per_s") or k == "tokens_generated"
        cells = [med[s]["steps_2_on"][k] for s in later]
        speeds = [(_over(n, o[k]) if faster else _over(o[k], n)) for n in cells]
        lines.append(f"| {k} (steps 2..{steps}) | {o[k]:.1f} | {_cells(cells, '.1f')} | {_cells(speeds, '.2f', 'x')} |")
    firsts = [med[s]["step_1"]["step_s"] for s in med]
    lines.append(
        f"| step_s (step 1) | {_cells(firsts, '.1f')} | {_cells([_over(firsts[0], x) for x in firsts[1:]], '.2f', 'x')} |"
    )
    walls = [med[s]["wall_s"] for s in med]
    lines.append(f"| process wall s | {_cells(walls, '.0f')} | {_cells([_over(walls[0], w) for w in walls[1:]], '.2f', 'x')} |")
    for k in RATES:
        cells = [med[s]["steps_2_on"][k] for s in med]
        shown = " | ".join("–" if x is None else f"{x:.1f} ({100 * x / peak:.0f} % of peak)" for x in cells)
        lines.append(f"| {k} (steps 2..{steps}) | {shown} |" + " |" * len(later))
    return lines


def _commit(code: Path) -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=code, capture_output=True, text=True).stdout.strip()


def _measure(args: argparse.Namespace, config: Path, by_side: dict[str, tuple[Path, list[str]]]) -> dict[str, list[dict]]:
    """Every repetition's run of every side, alternating; progress on stderr."""
    raw: dict[str, list[dict]] = {s: [] for s in by_side}
    with tempfile.TemporaryDirectory(prefix="graft-train-step-") as tmp:
        for rep in range(args.reps):
            for side, (code, extra) in by_side.items():
                r = run_side(code, config, args.steps, Path(tmp) / f"{side}{rep}", [*args.overrides, *extra])
                raw[side].append(r)
                per_step = ", ".join(f"{s['step_s']:.1f}" for s in r["steps"])
                say(f"rep {rep + 1} {side} ({r['module']}): steps {per_step} s, wall {r['wall_s']:.0f} s")
    return raw


def run(args: argparse.Namespace) -> int:
    """``graft bench train-step``: the sides' runs, a markdown table on stdout, every step in ``--out``."""
    if args.steps < 2 or args.reps < 1:
        raise ConfigError(f"--steps must be >= 2 and --reps >= 1, got {args.steps} and {args.reps}")
    by_side = sides(args)
    config = Path(args.config or default_config_path()).resolve()
    cfg = load_config(str(config), args.overrides)
    load_config(str(config), [*args.overrides, *args.recipe])  # a bad recipe stops here, before any run
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    peak = matmul_peak_gflops()
    raw = _measure(args, config, by_side)
    add_rates(raw, model_shapes(config, args.overrides))
    peak = max(peak, matmul_peak_gflops())
    med = {s: medians(rs) for s, rs in raw.items()}
    commits = {s: _commit(code) for s, (code, _) in by_side.items()}
    recipe = f"; recipe: new + {args.recipe}" if args.recipe else ""
    print(f"{', '.join(f'{s} {c}' for s, c in commits.items())}; config {config.name} {args.overrides}{recipe}")
    print(f"{args.reps} reps x {args.steps} steps")
    print("\n".join(table(med, args.steps, peak)))
    print(f"(ratios: {next(iter(med))} / side for seconds, side / {next(iter(med))} for tokens per second: > 1 means faster)")
    print(f"fp32 matmul peak on this host, {torch.get_num_threads()} threads, [1024, 1024] @ [1024, 1024]: {peak:.1f} GFLOP/s")
    if args.out:
        settings = vars(args) | {"config": str(config), "sides": {s: [str(c), e] for s, (c, e) in by_side.items()}}
        result = {"commits": commits, "matmul_peak_gflops": peak, "medians": med, "raw": raw, "args": settings}
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0
