"""Issue 39: the highest share of the fp32 matmul peak a default step could reach with this host's matmul kernels.

    python benchmarks/issue39_ceiling.py [--metrics RUN/metrics.jsonl] [--config FILE] [--rows-decode 64]
        [--rows-update 512] [--out FILE.json]

Every matmul of a step is timed alone, at its own shape, on 2 threads (best of a few repetitions, after a warm-up):
the decoder's linear layers (q, k, v, o, gate, up, down) and the LM head, forward ``x W^T`` and, for the update,
both backward products (``dy W`` and ``dy^T x``), with as many rows as a decode step has at most
(``rollout.batch_size``, 64) and as an update micro-batch has (``--rows-update``, ~8 responses plus their prompt).
The step's model FLOPs (``graft/bench/flops.py``: body and head, forward 1x, update 3x) for the per-model token
counts of a default step (medians over the steps of ``--metrics``) are then divided by the time those FLOPs take at
those isolated rates. Nothing else is counted: no attention, no elementwise work, no Python, no memory traffic
between the matmuls. The result is an upper bound on the share of the square-matmul peak any implementation built on
these kernels reaches over a whole step (decode steps use the most rows a step can have, which flatters them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from graft.bench.flops import matmul_peak_gflops, rollout_flops, update_flops
from graft.config import load_config
from graft.policy.loading import resolve_model_path

REPO = Path(__file__).resolve().parents[1]


def best_seconds(fn, reps: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def linear_seconds(n: int, d_in: int, d_out: int, backward: bool) -> float:
    """Seconds of ``[n, d_in] @ [d_in, d_out]`` (the forward), plus both backward products when asked."""
    x, w = torch.randn(n, d_in), torch.randn(d_out, d_in) * 0.02
    dy = torch.randn(n, d_out)
    t = best_seconds(lambda: torch.nn.functional.linear(x, w))
    if backward:
        t += best_seconds(lambda: dy @ w) + best_seconds(lambda: dy.t() @ x)
    return t


def layer_shapes(text_cfg) -> list[tuple[int, int]]:
    """(d_in, d_out) of one decoder layer's linear maps."""
    H, inter = text_cfg.hidden_size, text_cfg.intermediate_size
    heads, kv = text_cfg.num_attention_heads, getattr(text_cfg, "num_key_value_heads", None) or text_cfg.num_attention_heads
    hd = getattr(text_cfg, "head_dim", None) or H // heads
    return [(H, heads * hd), (H, kv * hd), (H, kv * hd), (heads * hd, H), (H, inter), (H, inter), (inter, H)]


def model_costs(path: str, rows_decode: int, rows_update: int) -> dict:
    """Seconds per token of each kind of work, at isolated-kernel rates."""
    from transformers import AutoConfig

    folder, gguf = resolve_model_path(path)
    cfg = AutoConfig.from_pretrained(folder, **({"gguf_file": gguf} if gguf else {}))
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    shapes, L, H, V = layer_shapes(text), text.num_hidden_layers, text.hidden_size, text.vocab_size

    def per_token(n: int, backward: bool, head: bool) -> float:
        if head:
            return linear_seconds(n, H, V, backward) / n
        return L * sum(linear_seconds(n, i, o, backward) for i, o in shapes) / n

    return {
        "s_body_decode": per_token(rows_decode, False, False),
        "s_head_decode": per_token(rows_decode, False, True),
        "s_body_update": per_token(rows_update, True, False),
        "s_head_update": per_token(rows_update, True, True),
        "s_body_prefill": per_token(rows_update, False, False),
    }


def step_tokens(metrics: Path, names: list[str]) -> dict[str, dict[str, float]]:
    """Median per-model token counts over the steps of a metrics.jsonl."""
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    steps = [r for r in rows if "time/step_s" in r]
    keys = ("tokens/prompt", "tokens/generated", "tokens/forwarded", "tokens/update")
    return {n: {k: statistics.median(float(r.get(f"{n}/{k}") or 0) for r in steps) for k in keys} for n in names}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(REPO / "configs/default.yaml"))
    ap.add_argument("--metrics", default=str(REPO / "results/default-job/exchange-plan/run/metrics.jsonl"))
    ap.add_argument("--rows-decode", type=int, default=64)
    ap.add_argument("--rows-update", type=int, default=512)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    models = load_config(args.config, []).models
    tokens = step_tokens(Path(args.metrics), [m.name for m in models])
    from issue39_commits import model_shapes  # the FLOP model's sizes (benchmarks/ is sys.path[0] when run)

    shapes = model_shapes(Path(args.config))
    peak = matmul_peak_gflops()
    flops = seconds = 0.0
    rows = []
    for m in models:
        c, t = model_costs(m.path, args.rows_decode, args.rows_update), tokens[m.name]
        parts = {
            "rollout": (
                rollout_flops(shapes[m.name], int(t["tokens/prompt"]), int(t["tokens/generated"])),
                c["s_body_prefill"] * t["tokens/prompt"] + (c["s_body_decode"] + c["s_head_decode"]) * t["tokens/generated"],
            ),
            "update": (
                update_flops(shapes[m.name], int(t["tokens/forwarded"]), int(t["tokens/update"])),
                c["s_body_update"] * t["tokens/forwarded"] + c["s_head_update"] * t["tokens/update"],
            ),
        }
        for phase, (f, s) in parts.items():
            rows.append({"model": m.name, "phase": phase, "gflop": f / 1e9, "ceiling_s": s, "gflops": f / 1e9 / s})
            flops, seconds = flops + f, seconds + s
        rows.append({"model": m.name, "tokens": t, "costs": c})
    peak = max(peak, matmul_peak_gflops())
    step = flops / 1e9 / seconds
    print(f"torch {torch.__version__}, 2 threads; token counts: medians of {args.metrics}")
    print("| model | phase | model GFLOP | seconds at isolated-kernel rates | GFLOP/s | share of peak |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        if "phase" in r:
            print(
                f"| {r['model']} | {r['phase']} | {r['gflop']:.0f} | {r['ceiling_s']:.1f} | {r['gflops']:.0f} | "
                f"{100 * r['gflops'] / peak:.0f} % |"
            )
    print(f"| all | step | {flops / 1e9:.0f} | {seconds:.1f} | {step:.0f} | **{100 * step / peak:.0f} %** |")
    print(f"fp32 matmul peak, [1024, 1024] @ [1024, 1024], 2 threads: {peak:.1f} GFLOP/s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"peak_gflops": peak, "step_gflops": step, "rows": rows, "args": vars(args)}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
