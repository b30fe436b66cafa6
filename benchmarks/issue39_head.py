"""Issue 39: the sampler's LM-head matmul as ``x @ W.T``, as ``W @ x.T`` over the exact rows, or padded (now).

    python benchmarks/issue39_head.py [--reps 3] [--config FILE] [--out FILE.json]

Part 1 times the head's matmul alone on each default model's head shape ([262144, 640] Gemma-3, [49152, 576]
SmolLM2; random fp32 weights) for 1 to 128 rows three ways: ``torch.mm(x, W.t(), out=z)`` (the sampler's kernel
until 8fa4c1c), ``torch.mm(W, x.t(), out=zt)`` over exactly the b rows plus the copy into [b, V] (7be4571 used it from
12 rows), and :meth:`graft.policy.policy.DecodeBuffers.logits` now (``W @ x.T`` over the rows zero-padded to a multiple
of ``HEAD_COLUMNS``). It says whether today's logits equal ``x @ W.T`` over the same rows and the logits of the same
rows in a batch of 128 (what makes a row's logits independent of how many rows are alive). Part 2 runs a warm rollout
of each model of ``--config`` (the study's default job by default: 8 prompts x 8 samples, 48 new tokens) with each
of the three sampler kernels, alternating, ``--reps`` times each, on the same prompts and seeds (tokens generated are
printed: equal unless rounding flipped a sample).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from graft.bench.common import environment
from graft.bench.runs import close_run, model_entry, single_model_config
from graft.config import load_config
from graft.policy.policy import DecodeBuffers
from graft.seeds import step_seed
from graft.trainer.loop import setup

REPO = Path(__file__).resolve().parents[1]
SHAPES = {"gemma3": (262144, 640), "smollm2": (49152, 576)}
ROWS = (1, 2, 4, 5, 7, 8, 11, 12, 15, 16, 17, 31, 32, 47, 64, 70, 100, 127, 128)


def best(fn, reps: int = 5) -> float:
    """The fastest of ``reps`` timed calls after one warm-up call, seconds."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def head_row(W: torch.Tensor, b: int, batch: torch.Tensor) -> dict:
    """Milliseconds of the head's matmul over ``b`` rows three ways, and what today's logits equal bit for bit."""
    V, H = W.shape
    x, z, zt = batch[:b].clone(), torch.empty(b, V), torch.empty(V, b)
    head, bufs = torch.nn.Linear(H, V, bias=False), DecodeBuffers()
    head.weight.data = W
    with torch.no_grad():
        now = bufs.logits(head, x).clone()
        full = DecodeBuffers().logits(head, batch)[:b]
        return {
            "rows": b,
            "untransposed_ms": 1e3 * best(lambda: torch.mm(x, W.t(), out=z)),
            "exact_ms": 1e3 * best(lambda: z.copy_(torch.mm(W, x.t(), out=zt).t())),
            "now_ms": 1e3 * best(lambda: bufs.logits(head, x)),
            "now_equals_untransposed": torch.equal(now, torch.mm(x, W.t())),
            "now_equals_batch_of_128": torch.equal(now, full),
        }


def matmul_table() -> list[dict]:
    """Milliseconds of the head's matmul per shape and row count, three ways."""
    rows = []
    for name, (V, H) in SHAPES.items():
        W, batch = torch.randn(V, H) * 0.02, torch.randn(max(ROWS), H)
        rows += [{"head": name, **head_row(W, b, batch)} for b in ROWS]
    return rows


def _untransposed(self: DecodeBuffers, head, hidden: torch.Tensor) -> torch.Tensor:
    """The sampler's head kernel until 8fa4c1c: ``x @ W.T`` into the reused [b, V] buffer."""
    if torch.is_grad_enabled() or type(head) is not torch.nn.Linear or head.bias is not None:
        return head(hidden).float()
    return torch.mm(hidden, head.weight.t(), out=self._rows("_z", hidden.shape[0], head.weight.shape[0], hidden))


def _exact_from_12(self: DecodeBuffers, head, hidden: torch.Tensor) -> torch.Tensor:
    """7be4571's: ``W @ x.T`` over exactly the b rows from 12 rows on, copied into [b, V]; fewer: ``x @ W.T``."""
    b, V = hidden.shape[0], head.weight.shape[0]
    if b < 12 or torch.is_grad_enabled() or type(head) is not torch.nn.Linear or head.bias is not None:
        return _untransposed(self, head, hidden)
    zt = torch.mm(head.weight, hidden.t(), out=self._flat(V, b, hidden))
    return self._rows("_z", b, V, hidden).copy_(zt.t())


def rollout_ab(config: str, reps: int) -> list[dict]:
    """Seconds of a warm rollout of each model with each kernel, alternating."""
    now, out = DecodeBuffers.logits, []
    with tempfile.TemporaryDirectory() as tmp:
        base = load_config(config, ["progress=false", "resume=false", f"run_dir={tmp}/base"])
        for m in base.models:
            entry = model_entry(base, m.path)
            cfg = single_model_config(base, entry, Path(tmp) / entry.name)
            run = setup(cfg)
            try:
                prompts, _ = run.sampler.next_batch()
                learner, seed = run.learners[entry.name], step_seed(cfg.seed, 1, entry.name)
                learner.rollout(prompts, cfg.rollout, 1, seed)  # warm-up
                sides = {"untransposed": _untransposed, "exact": _exact_from_12, "now": now}
                row: dict = {"model": entry.name, **{f"{k}_{x}": [] for k in sides for x in ("s", "tokens")}}
                for _ in range(reps):
                    for side, fn in sides.items():
                        DecodeBuffers.logits = fn  # type: ignore[method-assign]
                        t0 = time.perf_counter()
                        groups, _ = learner.rollout(prompts, cfg.rollout, 1, seed)
                        row[f"{side}_s"].append(time.perf_counter() - t0)
                        row[f"{side}_tokens"].append(sum(len(t) for g in groups for t in g.token_ids))
                DecodeBuffers.logits = now  # type: ignore[method-assign]
                now_s = statistics.median(row["now_s"])
                row |= {f"{k}_ratio": statistics.median(row[f"{k}_s"]) / now_s for k in ("untransposed", "exact")}
                out.append(row)
            finally:
                DecodeBuffers.logits = now  # type: ignore[method-assign]
                close_run(run)
                del run
                gc.collect()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--config", default=str(REPO / "configs/experiments/base/default-until-2026-12-04.yaml"))
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    result = {"environment": environment(), "threads": args.threads, "matmul": matmul_table()}
    print(
        "| head | rows | x @ W.T ms | W @ x.T exact ms | now (padded) ms | x @ W.T / now | exact / now "
        "| now = x @ W.T | now = batch of 128 |\n|---|---:|---:|---:|---:|---:|---:|---|---|"
    )
    for r in result["matmul"]:
        print(
            f"| {r['head']} | {r['rows']} | {r['untransposed_ms']:.1f} | {r['exact_ms']:.1f} | {r['now_ms']:.1f} | "
            f"{r['untransposed_ms'] / r['now_ms']:.2f}x | {r['exact_ms'] / r['now_ms']:.2f}x | "
            f"{r['now_equals_untransposed']} | {r['now_equals_batch_of_128']} |"
        )
    result["rollout"] = rollout_ab(args.config, args.reps)
    print(
        "\n| model | rollout s, x @ W.T | exact from 12 rows | now (padded) | x @ W.T / now | exact / now | tokens |"
        "\n|---|---|---|---|---:|---:|---|"
    )
    for r in result["rollout"]:
        cells = " | ".join(", ".join(f"{t:.2f}" for t in r[f"{k}_s"]) for k in ("untransposed", "exact", "now"))
        tokens = sorted(set(r["untransposed_tokens"] + r["exact_tokens"] + r["now_tokens"]))
        print(f"| {r['model']} | {cells} | {r['untransposed_ratio']:.2f}x | {r['exact_ratio']:.2f}x | {tokens} |")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
