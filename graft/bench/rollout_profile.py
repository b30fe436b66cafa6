"""Where a training step's time goes, per default model: a torch.profiler breakdown of graft's fp32
sampler, of the bf16 sampler (``rollout.engine=hf-bf16``), of the fp32 forward that recomputes the
behaviour log-probs (which that engine requires), on the same prompts and seeds as ``graft bench --only b``,
and of the update's compute on those samples: forward and backward of every response in the update's
micro-batches (``update_fwd_bwd``; the loss is the mean token log-prob, which costs what the policy loss
costs up to a few elementwise ops) and one AdamW step over the model after a warm-up step (``adamw_step``).

    graft bench rollout-profile [--config CFG] [--prompts 4] [--n 8] [--max-new-tokens 48] [--out DIR]

Operators are sorted into: the LM head (any operator with the vocabulary size V among its input
shapes: the logits matmul and the log-softmax / sampling over V), the body's matmuls, attention, other
operators, and the rest of the wall clock (Python, the decode loop, the profiler). Writes
``profile.json`` and ``profile.md``; the shares answer "what stands in the way" of a faster rollout.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from graft.bench.common import environment
from graft.bench.runs import close_run, default_config_path, model_entry, single_model_config
from graft.config import Config, load_config
from graft.seeds import step_seed
from graft.trainer.loop import setup

BODY_MATMULS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::_weight_int8pack_mm"}
ATTENTION = ("attention", "aten::_softmax", "aten::softmax")
PARTS = ("lm_head", "body_matmuls", "attention", "other_ops", "outside_ops")
PHASES = ("fp32_sampler", "bf16_sampler", "fp32_recompute", "update_fwd_bwd", "adamw_step")


def classify(name: str, shapes: list, vocab: int) -> str:
    """The part an operator's self time belongs to (see the module docstring)."""
    if any(vocab in s for s in shapes if isinstance(s, (list, tuple))):
        return "lm_head"
    if any(a in name for a in ATTENTION):
        return "attention"
    if name in BODY_MATMULS:
        return "body_matmuls"
    return "other_ops"


def breakdown(fn, vocab: int) -> dict:
    """Run ``fn`` under the profiler; seconds per part, with the wall clock outside any operator."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t0 = time.perf_counter()
        tokens = fn()
        wall = time.perf_counter() - t0
    parts = dict.fromkeys(PARTS, 0.0)
    for ev in prof.key_averages(group_by_input_shape=True):
        parts[classify(ev.key, ev.input_shapes or [], vocab)] += ev.self_cpu_time_total / 1e6
    parts["outside_ops"] = max(0.0, wall - sum(parts[p] for p in PARTS[:-1]))
    return {"wall_s": wall, "tokens": tokens, "seconds": parts, "share": {k: v / wall for k, v in parts.items()}}


def _profile_phases(learner, prompts, cfg: Config, seed: int, vocab: int) -> dict:
    """The three profiled phases of one learner, each after a warm-up call."""
    rc = cfg.rollout

    def sample() -> tuple:
        groups, _ = learner.rollout(prompts, rc, 1, seed)
        return groups, sum(len(t) for g in groups for t in g.token_ids)

    sample()  # warm-up: first-call allocations
    out = {"fp32_sampler": breakdown(lambda: sample()[1], vocab)}
    learner.workers.call("set_engine", [("hf-bf16",)], "set_engine")
    try:
        sample()
        out["bf16_sampler"] = breakdown(lambda: sample()[1], vocab)
        groups, tokens = sample()
        out["fp32_recompute"] = breakdown(
            lambda: (learner.recompute_old_logprobs(groups, cfg.update, rc.temperature), tokens)[1], vocab
        )
    finally:
        learner.workers.call("set_engine", [("hf",)], "set_engine")
    out["update_fwd_bwd"] = breakdown(lambda: _forward_backward(learner.policy, groups, cfg), vocab)
    optimizer = learner.policy.make_optimizer()
    optimizer.step()  # warm-up: the first step allocates the moments (page faults), later steps do not
    out["adamw_step"] = breakdown(lambda: (optimizer.step(), 0)[1], vocab)
    learner.policy.model.zero_grad(set_to_none=True)
    return out


def _forward_backward(policy, groups, cfg: Config) -> int:
    """The update's forward and backward over every sampled response, ``update.micro_batch_size`` rows at a time
    (gradients accumulate, as in a minibatch); returns the response tokens."""
    rows = [(g.prompt_token_ids, t) for g in groups for t in g.token_ids if t]
    uc = cfg.update
    policy.model.train()
    try:
        for i in range(0, len(rows), uc.micro_batch_size):
            micro = rows[i : i + uc.micro_batch_size]
            logp, mask = policy.forward_logprobs(
                [p for p, _ in micro], [t for _, t in micro], chunk=uc.logprob_chunk, temperature=cfg.rollout.temperature
            )
            ((logp * mask).sum() / len(rows)).backward()
    finally:
        policy.model.eval()
    return sum(len(t) for _, t in rows)


def profile_model(base: Config, path: str, run_root: Path) -> dict:
    """The profile of model ``path`` alone, on the config's first batch of prompts."""
    entry = model_entry(base, path)
    cfg = single_model_config(base, entry, run_root / entry.name)
    run = setup(cfg)
    try:
        prompts, _ = run.sampler.next_batch()
        learner = run.learners[entry.name]
        vocab = learner.policy.model.get_output_embeddings().weight.shape[0]
        seed = step_seed(cfg.seed, 1, entry.name)
        return {"name": entry.name, "vocab": vocab} | _profile_phases(learner, prompts, cfg, seed, vocab)
    finally:
        close_run(run)
        del run
        gc.collect()


def markdown(result: dict) -> str:
    """``profile.md``: one row per model and phase."""
    s = result["settings"]
    lines = [
        "# Where a rollout's and an update's time go",
        "",
        f"{result['environment'].get('cpu_model', '')}, torch {result['environment'].get('torch', '')}, "
        f"{s['threads']} threads; {s['prompts']} prompts x {s['n']} samples, {s['max_new_tokens']} new tokens. "
        "One profiled call per row (the samplers after a warm-up; update_fwd_bwd: forward and backward of every "
        "sampled response in the update's micro-batches, tok/s counting response tokens; adamw_step: one optimizer "
        "step over the whole model after a warm-up step, whose ops over the tied embedding count as LM head); "
        "seconds of operator self time per part (share of the wall clock).",
        "",
        "| model | phase | wall s | tok/s | LM head (V) | body matmuls | attention | other ops | outside ops |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in result["models"].values():
        for phase in PHASES:
            r = m[phase]
            cells = [f"{r['seconds'][p]:.2f} ({100 * r['share'][p]:.0f} %)" for p in PARTS]
            rate = f"{r['tokens'] / r['wall_s']:.1f}" if r["tokens"] else "–"
            lines.append(f"| {m['name']} (V={m['vocab']}) | {phase} | {r['wall_s']:.2f} | {rate} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """``graft bench rollout-profile``: profile every model of ``--config``; markdown on stdout, files in ``--out``."""
    with tempfile.TemporaryDirectory(prefix="graft-profile-") as tmp:
        base = load_config(
            args.config or default_config_path(),
            [
                f"batch_prompts={args.prompts}",
                f"rollout.n={args.n}",
                f"rollout.max_new_tokens={args.max_new_tokens}",
                "progress=false",
                "resume=false",
                f"run_dir={tmp}/base",
            ],
        )
        if base.threads:
            torch.set_num_threads(base.threads)
        result = {
            "settings": {
                "config": str(args.config or default_config_path()),
                "prompts": args.prompts,
                "n": args.n,
                "max_new_tokens": args.max_new_tokens,
                "threads": torch.get_num_threads(),
            },
            "environment": environment(),
            "models": {m.path: profile_model(base, m.path, Path(tmp)) for m in base.models},
        }
    md = markdown(result)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "profile.json").write_text(json.dumps(result, indent=2))
        (out / "profile.md").write_text(md)
    print(md)
    return 0
