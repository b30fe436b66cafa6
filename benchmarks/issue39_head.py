"""Issue 39: the sampler's LM-head matmul as ``x @ W.T`` (before) or as the transposed product ``W @ x.T`` (now).

    python benchmarks/issue39_head.py [--reps 3] [--config FILE] [--out FILE.json]

Part 1 times the head's matmul alone on each default model's head shape ([262144, 640] Gemma-3, [49152, 576]
SmolLM2; random fp32 weights) for 1 to 128 rows: ``torch.mm(x, W.t(), out=z)`` (the sampler's kernel before) against
``torch.mm(W, x.t(), out=zt)`` followed by the copy into [b, V] that :meth:`graft.policy.policy.DecodeBuffers.logits`
now does, and says whether the two are bit-identical. Part 2 runs a warm rollout of each model of ``--config`` (the
study's default job by default: 8 prompts x 8 samples, 48 new tokens) with each kernel, alternating, ``--reps`` times
each, on the same prompts and seeds (tokens generated are printed: equal unless rounding flipped a sample).
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
ROWS = (1, 2, 4, 8, 16, 32, 64, 128)


def best(fn, reps: int = 5) -> float:
    """The fastest of ``reps`` timed calls after one warm-up call, seconds."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def head_row(W: torch.Tensor, b: int) -> dict:
    """Milliseconds of the head's matmul over ``b`` rows both ways, and whether the two agree bit for bit."""
    V, H = W.shape
    x, z, zt = torch.randn(b, H), torch.empty(b, V), torch.empty(V, b)
    before = best(lambda: torch.mm(x, W.t(), out=z))
    now = best(lambda: z.copy_(torch.mm(W, x.t(), out=zt).t()))
    equal = torch.equal(torch.mm(x, W.t()), torch.mm(W, x.t()).t())
    return {"rows": b, "before_ms": 1e3 * before, "now_ms": 1e3 * now, "bit_identical": equal}


def matmul_table() -> list[dict]:
    """Milliseconds of the head's matmul per shape and row count, both ways."""
    rows = []
    for name, (V, H) in SHAPES.items():
        W = torch.randn(V, H) * 0.02
        rows += [{"head": name, **head_row(W, b)} for b in ROWS]
    return rows


def _before(self: DecodeBuffers, head, hidden: torch.Tensor) -> torch.Tensor:
    """The sampler's head kernel before: ``x @ W.T`` into the reused [b, V] buffer."""
    if torch.is_grad_enabled() or type(head) is not torch.nn.Linear or head.bias is not None:
        return head(hidden).float()
    return torch.mm(hidden, head.weight.t(), out=self._rows("_z", hidden.shape[0], head.weight.shape[0], hidden))


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
                row: dict = {"model": entry.name, "before_s": [], "now_s": [], "before_tokens": [], "now_tokens": []}
                for _ in range(reps):
                    for side, fn in (("before", _before), ("now", now)):
                        DecodeBuffers.logits = fn  # type: ignore[method-assign]
                        t0 = time.perf_counter()
                        groups, _ = learner.rollout(prompts, cfg.rollout, 1, seed)
                        row[f"{side}_s"].append(time.perf_counter() - t0)
                        row[f"{side}_tokens"].append(sum(len(t) for g in groups for t in g.token_ids))
                DecodeBuffers.logits = now  # type: ignore[method-assign]
                row["ratio"] = statistics.median(row["before_s"]) / statistics.median(row["now_s"])
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
    print("| head | rows | x @ W.T ms | W @ x.T + copy ms | speed-up | bit-identical |\n|---|---:|---:|---:|---:|---|")
    for r in result["matmul"]:
        print(
            f"| {r['head']} | {r['rows']} | {r['before_ms']:.1f} | {r['now_ms']:.1f} | "
            f"{r['before_ms'] / r['now_ms']:.2f}x | {r['bit_identical']} |"
        )
    result["rollout"] = rollout_ab(args.config, args.reps)
    print("\n| model | rollout s, x @ W.T | rollout s, W @ x.T | before / now | tokens |\n|---|---|---|---:|---|")
    for r in result["rollout"]:
        print(
            f"| {r['model']} | {', '.join(f'{t:.2f}' for t in r['before_s'])} | {', '.join(f'{t:.2f}' for t in r['now_s'])}"
            f" | {r['ratio']:.2f}x | {sorted(set(r['before_tokens'] + r['now_tokens']))} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
