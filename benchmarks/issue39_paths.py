"""Issue 39: each change alone, old path vs new path, side by side in one process.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/issue39_paths.py [--reps 3] [--steps 16] [--parts decode,entropy,head,models]

The sides alternate repetition by repetition (old, new, old, new, ...) on the same inputs; every part first checks
that both sides compute the same values (bit for bit) and then prints the medians and their ratio.

Shapes are the default job's Gemma-3-270M head (the one that costs: H = 640, V = 262144, no softcapping):

- ``decode``: ``--steps`` sampling steps (of the default job's 48) of a 64-row generation batch
  (``rollout.batch_size``), logits + sampling (:meth:`Policy._step_logits`, :meth:`Policy._sample`), fresh
  [B, V] tensors per step (old) vs :class:`DecodeBuffers` reused (new); entropy on in both, as in the rollout.
  Also counts minor page faults.
- ``entropy``: the same steps with reused buffers, entropy recorded (old, what every sampler call did) vs not
  (new: evaluation, probes, ``onestep``; the rollout still records it, it is logged every step).
- ``head``: :class:`_HeadLogProb` forward + backward over one update micro-batch, 8 x 48 = 384 response tokens
  in chunks of 256 (``update.logprob_chunk``): logits recomputed in backward (old, 4 head matmuls) vs kept
  (new, 3; 0.4 GB held from forward to backward).
- ``models``: two synthetic models (an MLP's forward + backward, matmul-bound) one after the other on this
  thread (old) vs side by side, one Python thread each with 1 torch thread (:func:`graft.trainer.loop.per_model`).
  Under ``taskset -c 1`` both threads share one core, so this measures the overhead of the threads, not the
  overlap: the speedup needs two idle cores.

Weights and hidden states are random (no timing here depends on their values).
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time
from types import SimpleNamespace
from typing import Callable

import torch

from graft.policy.policy import DecodeBuffers, Policy, _HeadLogProb
from graft.trainer import loop

H, V, B = 640, 262144, 64


def timed(fn: Callable[[], object]) -> tuple[float, int, object]:
    """Seconds, minor page faults and result of ``fn()``."""
    f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0, out


def side_by_side(name: str, old: Callable[[], object], new: Callable[[], object], reps: int,
                 same: Callable[[object, object], bool]) -> None:
    """Alternate ``old`` and ``new`` ``reps`` times each; check the results agree; print medians and ratio."""
    ts: dict[str, list[float]] = {"old": [], "new": []}
    fs: dict[str, list[int]] = {"old": [], "new": []}
    outs: dict[str, object] = {}
    for _ in range(reps):
        for side, fn in (("old", old), ("new", new)):
            t, f, outs[side] = timed(fn)
            ts[side].append(t)
            fs[side].append(f)
    assert same(outs["old"], outs["new"]), f"{name}: the two paths disagree"
    mo, mn = statistics.median(ts["old"]), statistics.median(ts["new"])
    print(f"{name}: old {mo:.3f} s, new {mn:.3f} s (medians of {reps}), old/new = {mo / mn:.2f}x; "
          f"minor page faults per rep: old {statistics.median(fs['old']):.0f}, new {statistics.median(fs['new']):.0f}")
    print(f"  raw old {[round(x, 3) for x in ts['old']]}  new {[round(x, 3) for x in ts['new']]}")


def _decode(head: torch.nn.Linear, hs: list[torch.Tensor], bufs: DecodeBuffers | None) -> list:
    """``len(hs)`` sampling steps of ``B`` rows (one generation batch), as ``Policy._generate_batch`` runs them."""
    pol = SimpleNamespace(softcap=None)
    gen = torch.Generator().manual_seed(0)
    out = []
    with torch.no_grad():
        for h in hs:
            tok, lp, ent = Policy._sample(Policy._step_logits(pol, h, 1.0, head, bufs), 1.0, gen, False, bufs)
            out.append((tok.tolist(), lp.tolist(), None if ent is None else ent.tolist()))
    return out


def part_decode(reps: int, head: torch.nn.Linear, hs: list[torch.Tensor]) -> None:
    side_by_side(f"decode buffers ({len(hs)} steps x 64 rows, V=262144)", lambda: _decode(head, hs, None),
                 lambda: _decode(head, hs, DecodeBuffers(entropy=True, reuse=True)), reps, lambda a, b: a == b)


def part_entropy(reps: int, head: torch.nn.Linear, hs: list[torch.Tensor]) -> None:
    same = lambda a, b: [x[:2] for x in a] == [x[:2] for x in b]  # noqa: E731  tokens and log-probs
    side_by_side(f"entropy off ({len(hs)} steps x 64 rows, reused buffers)", lambda: _decode(head, hs, DecodeBuffers(True)),
                 lambda: _decode(head, hs, DecodeBuffers(entropy=False)), reps, same)


def _head_step(h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, keep: bool, chunk: int = 256) -> tuple:
    """Forward + backward of the fused head over ``h`` [n, H] in chunks, as ``Policy.forward_logprobs`` runs it."""
    h, w = h.detach().requires_grad_(), w.detach().requires_grad_()
    parts = [_HeadLogProb.apply(h[i:i + chunk], w, None, targets[i:i + chunk], None, 1.0, keep)
             for i in range(0, h.shape[0], chunk)]
    logp = torch.cat(parts)
    logp.sum().backward()
    return logp.detach(), h.grad, w.grad


def part_head(reps: int) -> None:
    g = torch.Generator().manual_seed(1)
    h, w = torch.randn(384, H, generator=g), torch.randn(V, H, generator=g) * 0.02
    targets = torch.randint(0, V, (384,), generator=g)
    same = lambda a, b: all(torch.equal(x, y) for x, y in zip(a, b, strict=True))  # noqa: E731
    side_by_side("head forward+backward (384 tokens, chunks of 256, V=262144)", lambda: _head_step(h, w, targets, False),
                 lambda: _head_step(h, w, targets, True), reps, same)


def _mlp_work(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x, w1, w2 = torch.randn(256, 1024, generator=g), torch.randn(1024, 2048, generator=g), torch.randn(2048, 1024, generator=g)
    w1.requires_grad_()
    for _ in range(6):
        (torch.relu(x @ w1) @ w2).square().mean().backward()
    return w1.grad


def part_models(reps: int) -> None:
    def run(spec: dict):
        fake = SimpleNamespace(cfg=SimpleNamespace(threads_per_model=spec), learners={"A": 0, "B": 0})
        return loop.per_model(fake, "update", lambda n: _mlp_work(0 if n == "A" else 1))
    same = lambda a, b: all(torch.equal(a[k], b[k]) for k in a)  # noqa: E731
    side_by_side(f"two models, sequential on {torch.get_num_threads()} thread(s) vs side by side with 1 thread each",
                 lambda: run({}), lambda: run({"update": 1}), reps, same)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--parts", default="decode,entropy,head,models")
    args = ap.parse_args()
    parts = args.parts.split(",")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {torch.backends.cpu.get_cpu_capability()}")
    head = torch.nn.Linear(H, V, bias=False)
    hs = [torch.randn(B, H, generator=torch.Generator().manual_seed(100 + i)) for i in range(args.steps)]
    if "decode" in parts:
        part_decode(args.reps, head, hs)
    if "entropy" in parts:
        part_entropy(args.reps, head, hs)
    if "head" in parts:
        part_head(args.reps)
    if "models" in parts:
        part_models(args.reps)


if __name__ == "__main__":
    main()
