"""How far from the machine's limit a step runs: model FLOPs per phase from a step's token counts, and the fp32
matmul rate this host reaches on square matrices (``graft bench`` prints both, and their ratio).

Model FLOPs count each multiply-add once as 2 FLOPs and only what the model needs, not what an implementation
recomputes (the convention of MFU): a forward pass costs ``2 * body`` per position through the decoder and
``2 * H * V`` per position whose next-token distribution is computed (the head); a backward pass costs twice its
forward. ``body`` is every parameter except the input embedding and the head (the embedding is a lookup, the
head is counted apart). Attention's score and value products are left out (``4 * L * ctx * d`` per position:
about 5 % of ``2 * body`` at the default task's ~200-token contexts), so the rates below slightly understate.

- rollout: the decoder over every prompt token once (prefill; the G samples of a prompt share its KV cache) and
  every generated token; the head on every generated token;
- update: forward + backward (3x) over the positions the update forwarded (``tokens/forwarded``: each prompt
  once per micro-batch group plus every response) and the head on every trained response token
  (``tokens/update``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ModelShape:
    """The sizes a FLOP count needs."""

    body: int
    """Parameters in the decoder (all but the input embedding and the head)."""
    hidden: int
    """H, the head's input width."""
    vocab: int
    """V, the head's output width."""


def model_shape(model: Any) -> ModelShape:
    """:class:`ModelShape` of a Hugging Face causal LM (a ``PreTrainedModel``; tied or untied head)."""
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    skip = {id(emb), id(head)}
    body = sum(p.numel() for p in model.parameters() if id(p) not in skip)
    V, H = head.shape
    return ModelShape(body=body, hidden=H, vocab=V)


def rollout_flops(shape: ModelShape, prompt_tokens: int, generated: int) -> float:
    """Model FLOPs of sampling: ``2 * body * (prompt_tokens + generated) + 2 * H * V * generated``."""
    assert prompt_tokens >= 0 and generated >= 0, (prompt_tokens, generated)
    return 2.0 * shape.body * (prompt_tokens + generated) + 2.0 * shape.hidden * shape.vocab * generated


def update_flops(shape: ModelShape, forwarded: int, trained: int) -> float:
    """Model FLOPs of an update (forward + backward): ``3 * (2 * body * forwarded + 2 * H * V * trained)``."""
    assert forwarded >= trained >= 0, (forwarded, trained)
    return 3.0 * (2.0 * shape.body * forwarded + 2.0 * shape.hidden * shape.vocab * trained)


def phase_rates(metrics: dict, shapes: dict[str, ModelShape]) -> dict:
    """Model GFLOP and GFLOP/s of one step's rollout and update, summed over the models, from its metrics
    (``M/tokens/prompt``, ``M/tokens/generated``, ``M/tokens/forwarded``, ``M/tokens/update``, ``time/*_s``)."""
    get = lambda name, key: int(metrics.get(f"{name}/{key}") or 0)  # noqa: E731
    work = {
        "rollout": sum(rollout_flops(s, get(n, "tokens/prompt"), get(n, "tokens/generated")) for n, s in shapes.items()),
        "update": sum(update_flops(s, get(n, "tokens/forwarded"), get(n, "tokens/update")) for n, s in shapes.items()),
    }
    work["step"] = work["rollout"] + work["update"]
    out: dict[str, float | None] = {}
    for phase, flops in work.items():
        seconds = metrics.get(f"time/{phase}_s")
        out[f"{phase}_gflop"] = flops / 1e9
        out[f"{phase}_gflops"] = flops / 1e9 / seconds if seconds else None
    return out


def matmul_peak_gflops(n: int = 1024, seconds: float = 2.0) -> float:
    """The best fp32 GFLOP/s of ``[n, n] @ [n, n]`` on this host with torch's current threads, over repetitions
    for about ``seconds`` (after one warm-up): the limit a step's achieved rate is compared with."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    torch.mm(a, b, out=out)
    best, t_end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best / 1e9
