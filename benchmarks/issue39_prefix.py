"""Issue 39: the shared few-shot prefix (``models.I.common_prefix``), off vs on, side by side in one process.

    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/issue39_prefix.py [--reps 3] [--prompts 8] [--rows 16]

On the embedded default pair as ``configs/default.yaml`` sets them up (SmolLM2 chat template, Gemma-3 few-shot, the
arithmetic task's prompts): per model, the sides alternate repetition by repetition (off, on, off, on, ...) on the
same inputs and seeds:

- ``generate``: one rollout batch, ``--prompts`` prompts x ``rollout.n`` samples, ``rollout.max_new_tokens``, T = 1.0,
  per-sample seeds (prefill of the distinct prompts, then decoding; only the prefill changes).
- ``update``: :meth:`Policy.forward_logprobs` forward + backward over ``--rows`` rows of ``--rows / rollout.n``
  prompts (the prefix is shared only between distinct prompts of one micro-batch: with the default
  ``update.micro_batch_size`` = ``rollout.n`` = 8 a micro-batch holds one prompt and nothing changes there).

Before timing, each part reports how far the two sides agree (the same token ids? the largest log-prob and gradient
difference): equal up to float rounding, not bit for bit.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from graft.config import load_config
from graft.data.arithmetic import make_arithmetic
from graft.policy.policy import Policy


def medians(name: str, ts: dict[str, list[float]]) -> None:
    off, on = statistics.median(ts["off"]), statistics.median(ts["on"])
    print(f"  {name}: off {off:.2f} s, on {on:.2f} s (medians of {len(ts['off'])}), off/on = {off / on:.2f}x")
    print(f"    raw off {[round(t, 2) for t in ts['off']]}  on {[round(t, 2) for t in ts['on']]}")


def bench_generate(policy: Policy, prompts: list[list[int]], n: int, max_new: int, reps: int) -> None:
    ts: dict[str, list[float]] = {"off": [], "on": []}
    outs = {}
    for _ in range(reps):
        for side in ("off", "on"):
            policy.common_prefix = side == "on"
            t0 = time.perf_counter()
            outs[side] = policy.generate(prompts, n, max_new, temperature=1.0, batch_size=len(prompts) * n,
                                         seeds=list(range(len(prompts))), entropy=True)
            ts[side].append(time.perf_counter() - t0)
    a = [s for g in outs["off"] for s in g]
    b = [s for g in outs["on"] for s in g]
    same = sum(x.token_ids == y.token_ids for x, y in zip(a, b, strict=True))
    dlp = max(abs(p - q) for x, y in zip(a, b, strict=True) if x.token_ids == y.token_ids
              for p, q in zip(x.logprobs, y.logprobs, strict=True))
    print(f"  generate: {same} of {len(a)} samples token for token the same; largest log-prob difference among them {dlp:.1e}")
    medians("generate", ts)


def bench_update(policy: Policy, prompts: list[list[int]], responses: list[list[int]], reps: int) -> None:
    ts: dict[str, list[float]] = {"off": [], "on": []}
    got = {}
    params = policy.trainable_parameters()
    for _ in range(reps):
        for side in ("off", "on"):
            policy.common_prefix = side == "on"
            policy.model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            logp, mask = policy.forward_logprobs(prompts, responses)
            (logp * mask).sum().backward()
            ts[side].append(time.perf_counter() - t0)
            got[side] = (logp.detach(), torch.cat([p.grad.flatten() for p in params if p.grad is not None]))
    dlp = (got["off"][0] - got["on"][0]).abs().max().item()
    dg = ((got["off"][1] - got["on"][1]).norm() / got["off"][1].norm()).item()
    print(f"  update: largest log-prob difference {dlp:.1e}, gradient relative difference {dg:.1e}")
    medians("update", ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8, help="prompts of the generation batch")
    ap.add_argument("--rows", type=int, default=16, help="rows of the update micro-batch (rollout.n rows per prompt)")
    args = ap.parse_args()
    cfg = load_config("default")
    torch.manual_seed(0)
    problems = [p.problem for p in make_arithmetic(args.prompts, 20, ["+", "-", "*"], seed=0)]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {torch.backends.cpu.get_cpu_capability()}")
    for mcfg in cfg.models:
        policy = Policy.load(mcfg)
        ids = [policy.codec.encode_prompt(p) for p in problems]
        common = next((i for i, col in enumerate(zip(*ids, strict=False)) if len(set(col)) > 1), min(map(len, ids)))
        print(f"{mcfg.name}: prompts {min(map(len, ids))}-{max(map(len, ids))} tokens, {common} of them common to all")
        bench_generate(policy, ids, cfg.rollout.n, cfg.rollout.max_new_tokens, args.reps)
        per = max(1, args.rows // cfg.rollout.n)
        samples = policy.generate(ids[:per], cfg.rollout.n, cfg.rollout.max_new_tokens, seeds=list(range(per)))
        rows = [(ids[i], s.token_ids) for i in range(per) for s in samples[i]]
        policy.model.train()
        bench_update(policy, [p for p, _ in rows], [r for _, r in rows], args.reps)
        del policy


if __name__ == "__main__":
    main()
