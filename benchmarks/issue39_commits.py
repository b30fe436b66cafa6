"""Issue 39: the default GRAFT step at two commits, side by side on one machine, as ``graft train`` runs it.

    python benchmarks/issue39_commits.py --old /path/to/worktree-at-afebb7d [--new .] [--reps 2] [--steps 4]
        [--config FILE] [--out FILE.json] [--recipe key=value ...] [key=value ...]

Each repetition runs ``graft train CONFIG steps=K`` once with the old commit's code and once with the new commit's
(alternating old, new, old, new, ... so that a machine that drifts affects both alike), each in its own process
whose working directory and ``PYTHONPATH`` are that commit's checkout (the module each side imported is checked and
printed). Both sides read the same config file (default: ``configs/experiments/base/default-until-2026-12-04.yaml``,
the default job as it was until 2026-12-04, verbatim the old commit's ``configs/default.yaml``), with the same seed,
so step 1 trains on the same prompts with the same sampling seeds. Figures come from each run's ``metrics.jsonl``:
``time/step_s`` and its phases, and tokens per second of rollout (generated tokens over rollout seconds) and update
(update tokens over update seconds), the work-independent figures: a change that legitimately reorders float sums
(the shared prefix) flips sampled tokens, and from there the two sides do different amounts of work. Step 1 pays
the first allocations and is reported apart; the medians are over steps 2..K of every repetition.

``--recipe key=value`` (repeatable) adds a third side, ``recipe``: the new commit's code with those overrides on top
(e.g. the bf16 mixed-precision recipe, ``rollout.engine=hf-bf16 update.recompute_old_logprobs=true
models.0.autocast=bfloat16 models.1.autocast=bfloat16``), alternating with the other two.
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

from graft.bench.flops import ModelShape, matmul_peak_gflops, model_shape, phase_rates
from graft.config import load_config
from graft.policy.loading import resolve_model_path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "configs/experiments/base/default-until-2026-12-04.yaml"
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


def run_side(code: Path, config: Path, steps: int, run_dir: Path, overrides: list[str]) -> dict:
    """One ``graft train`` process on ``code``'s checkout; its per-step figures, wall seconds and imported module."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    module = subprocess.run(
        [sys.executable, "-c", "import graft; print(graft.__file__)"], cwd=code, env=env, capture_output=True, text=True
    ).stdout.strip()
    cmd = [sys.executable, "-m", "graft.cli", "-q", "train", str(config), f"steps={steps}", f"run_dir={run_dir}"]
    cmd += ["progress=false", "threads=2", f"checkpoint.save_every={steps + 1}", *overrides]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=code, env=env, check=True)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    shutil.rmtree(run_dir)  # its final checkpoint holds both models and their optimiser states (~4.6 GB)
    steps_rows = [step_figures(r) | {"metrics": r} for r in rows if "time/step_s" in r]
    return {"module": module, "wall_s": wall, "steps": steps_rows}


def model_shapes(config: Path) -> dict[str, ModelShape]:
    """The FLOP-relevant sizes of the config's models, from their configs alone (no weights loaded)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    shapes = {}
    for m in load_config(str(config), []).models:
        folder, gguf = resolve_model_path(m.path)
        cfg = AutoConfig.from_pretrained(folder, **({"gguf_file": gguf} if gguf else {}))
        with torch.device("meta"):
            shapes[m.name] = model_shape(AutoModelForCausalLM.from_config(cfg))
    return shapes


def add_rates(raw: dict[str, list[dict]], shapes: dict[str, ModelShape]) -> None:
    """Model GFLOP/s of every step's rollout, update and whole step (``graft.bench.flops``), from its token counts;
    None where a side's metrics lack a count the FLOP model needs."""
    needed = ("tokens/prompt", "tokens/generated", "tokens/forwarded", "tokens/update")
    for runs in raw.values():
        for r in runs:
            for s in r["steps"]:
                m = s.pop("metrics")
                s["kept"] = {k: v for k, v in m.items() if k.split("/", 1)[-1] in KEPT}
                complete = all(f"{n}/{k}" in m for n in shapes for k in needed)
                rates = phase_rates(m, shapes)
                s |= {k: (rates[k] if complete else None) for k in ("rollout_gflops", "update_gflops", "step_gflops")}


def _median(xs: list) -> float | None:
    return None if None in xs else statistics.median(xs)


def medians(runs: list[dict]) -> dict:
    later = [s for r in runs for s in r["steps"][1:]]
    first = [r["steps"][0] for r in runs]
    return {
        "steps_2_on": {k: _median([s[k] for s in later]) for k in FIELDS + RATES},
        "step_1": {k: _median([s[k] for s in first]) for k in FIELDS + RATES},
        "wall_s": statistics.median(r["wall_s"] for r in runs),
    }


def _cells(xs: list[float], fmt: str, unit: str = "") -> str:
    return " | ".join(f"{x:{fmt}}{unit}" for x in xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, type=Path, help="checkout of the old commit")
    ap.add_argument("--new", default=REPO, type=Path, help="checkout of the new commit (default: this one)")
    ap.add_argument("--config", default=DEFAULT_CONFIG, type=Path)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", default=None)
    ap.add_argument("--recipe", action="append", default=[], help="key=value of a third side on the new code")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    sides = {"old": (args.old.resolve(), []), "new": (args.new.resolve(), [])}
    if args.recipe:
        sides["recipe"] = (args.new.resolve(), args.recipe)
    torch.set_num_threads(2)
    peak = matmul_peak_gflops()
    raw: dict[str, list[dict]] = {s: [] for s in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for side, (code, extra) in sides.items():
                r = run_side(code, args.config.resolve(), args.steps, Path(tmp) / f"{side}{rep}", [*args.overrides, *extra])
                raw[side].append(r)
                per_step = ", ".join(f"{s['step_s']:.1f}" for s in r["steps"])
                print(
                    f"rep {rep + 1} {side} ({r['module']}): steps {per_step} s, wall {r['wall_s']:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
    add_rates(raw, model_shapes(args.config))
    peak = max(peak, matmul_peak_gflops())
    med = {s: medians(rs) for s, rs in raw.items()}
    commits = {
        s: subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=c, capture_output=True, text=True).stdout.strip()
        for s, (c, _) in sides.items()
    }
    what = f"config {args.config.name} {args.overrides}; {args.reps} reps x {args.steps} steps"
    print(f"old {commits['old']} vs new {commits['new']}; {what}" + (f"; recipe: new + {args.recipe}" if args.recipe else ""))
    later = [s for s in sides if s != "old"]
    print(f"| medians | old | {' | '.join(later)} | {' | '.join(f'old / {s}' for s in later)} |")
    print("|---|---:|" + "---:|" * 2 * len(later))
    o = med["old"]["steps_2_on"]
    for k in FIELDS:
        faster = k.endswith("per_s") or k == "tokens_generated"
        cells = [med[s]["steps_2_on"][k] for s in later]
        speeds = [(n / o[k] if faster else o[k] / n) for n in cells]
        print(f"| {k} (steps 2..{args.steps}) | {o[k]:.1f} | {_cells(cells, '.1f')} | {_cells(speeds, '.2f', 'x')} |")
    firsts = [med[s]["step_1"]["step_s"] for s in ("old", *later)]
    speeds = [firsts[0] / x for x in firsts[1:]]
    print(f"| step_s (step 1) | {_cells(firsts, '.1f')} | {_cells(speeds, '.2f', 'x')} |")
    walls = [med[s]["wall_s"] for s in ("old", *later)]
    print(f"| process wall s | {_cells(walls, '.0f')} | {_cells([walls[0] / w for w in walls[1:]], '.2f', 'x')} |")
    for k in RATES:
        cells = [med[s]["steps_2_on"][k] for s in ("old", *later)]
        shown = " | ".join("–" if x is None else f"{x:.1f} ({100 * x / peak:.0f} % of peak)" for x in cells)
        print(f"| {k} (steps 2..{args.steps}) | {shown} |" + " |" * len(later))
    print("(speed ratios: old/new for seconds, new/old for tokens per second: > 1 means the new commit is faster)")
    print(f"fp32 matmul peak on this host, 2 threads, [1024, 1024] @ [1024, 1024], best before/after: {peak:.1f} GFLOP/s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "commits": commits,
                    "matmul_peak_gflops": peak,
                    "medians": med,
                    "raw": raw,
                    "args": vars(args) | {"old": str(args.old), "new": str(args.new), "config": str(args.config)},
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
