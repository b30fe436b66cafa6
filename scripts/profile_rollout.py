"""Where a training rollout's time goes, per default model: a torch.profiler breakdown of graft's fp32
sampler, of the bf16 sampler (``rollout.engine=hf-bf16``) and of the fp32 forward that recomputes the
behaviour log-probs (which that engine requires), on the same prompts and seeds as ``graft bench --only b``.

    python scripts/profile_rollout.py --out benchmarks/results/cpu-profile

Operators are sorted into: the LM head (any operator with the vocabulary size V among its input
shapes: the logits matmul and the log-softmax / sampling over V), the body's matmuls, attention, other
operators, and the rest of the wall clock (Python, the decode loop, the profiler). Writes
``profile.json`` and ``profile.md``; the shares answer "what stands in the way" of a faster rollout.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graft.bench import default_config_path, environment, model_entry, single_model_config  # noqa: E402
from graft.config import load_config  # noqa: E402

BODY_MATMULS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::_weight_int8pack_mm"}
ATTENTION = ("attention", "aten::_softmax", "aten::softmax")
PARTS = ("lm_head", "body_matmuls", "attention", "other_ops", "outside_ops")


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


def profile_model(base, path: str, run_root: Path) -> dict:
    from graft.distributed.ray_backend import close_learners
    from graft.trainer.loop import setup, step_seed

    entry = model_entry(base, path)
    cfg = single_model_config(base, entry, run_root / entry.name)
    run = setup(cfg)
    try:
        prompts, _ = run.sampler.next_batch()
        learner, rc = run.learners[entry.name], cfg.rollout
        vocab = learner.policy.model.get_output_embeddings().weight.shape[0]
        seed = step_seed(cfg.seed, 1, entry.name)
        out = {"name": entry.name, "vocab": vocab}

        def sample() -> tuple:
            groups, _ = learner.rollout(prompts, rc, 1, seed)
            return groups, sum(len(t) for g in groups for t in g.token_ids)

        sample()   # warm-up: first-call allocations
        out["fp32_sampler"] = breakdown(lambda: sample()[1], vocab)
        learner.workers.call("set_engine", [("hf-bf16",)], "set_engine")
        try:
            sample()
            out["bf16_sampler"] = breakdown(lambda: sample()[1], vocab)
            groups, tokens = sample()
            out["fp32_recompute"] = breakdown(
                lambda: (learner.recompute_old_logprobs(groups, cfg.update, rc.temperature), tokens)[1], vocab)
        finally:
            learner.workers.call("set_engine", [("hf",)], "set_engine")
        return out
    finally:
        run.grader.close()
        close_learners(run.learners)
        del run
        gc.collect()


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = ["# Where a rollout's time goes", "",
             f"{result['environment'].get('cpu_model', '')}, torch {result['environment'].get('torch', '')}, "
             f"{s['threads']} threads; {s['prompts']} prompts x {s['n']} samples, {s['max_new_tokens']} new tokens. "
             "One profiled call per row after a warm-up; seconds of operator self time per part "
             "(share of the wall clock).", "",
             "| model | phase | wall s | tok/s | LM head (V) | body matmuls | attention | other ops | outside ops |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m in result["models"].values():
        for phase in ("fp32_sampler", "bf16_sampler", "fp32_recompute"):
            r = m[phase]
            cells = [f"{r['seconds'][p]:.2f} ({100 * r['share'][p]:.0f} %)" for p in PARTS]
            lines.append(f"| {m['name']} (V={m['vocab']}) | {phase} | {r['wall_s']:.2f} | "
                         f"{r['tokens'] / r['wall_s']:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(default_config_path()))
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--out", default=None, help="folder for profile.json and profile.md")
    args = p.parse_args(argv)
    import tempfile
    with tempfile.TemporaryDirectory(prefix="graft-profile-") as tmp:
        base = load_config(args.config, [f"batch_prompts={args.prompts}", f"rollout.n={args.n}",
                                         f"rollout.max_new_tokens={args.max_new_tokens}", "progress=false",
                                         "resume=false", f"run_dir={tmp}/base"])
        if base.threads:
            torch.set_num_threads(base.threads)
        result = {"settings": {"config": args.config, "prompts": args.prompts, "n": args.n,
                               "max_new_tokens": args.max_new_tokens, "threads": torch.get_num_threads()},
                  "environment": environment(),
                  "models": {m.path: profile_model(base, m.path, Path(tmp)) for m in base.models}}
    md = markdown(result)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "profile.json").write_text(json.dumps(result, indent=2))
        (out / "profile.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
