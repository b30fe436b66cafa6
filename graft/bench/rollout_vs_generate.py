"""Part (b) of ``graft bench``: graft's rollout against plain ``model.generate`` on the same loaded
model and prompts, plus graft's bf16 sampler followed by the fp32 recompute of the log-probs."""

from __future__ import annotations

import gc
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from graft.bench.common import alternate, progress, summarize
from graft.bench.runs import close_run, model_entry, single_model_config
from graft.config import Config, ModelConfig
from graft.policy.sampling import SamplingParams, rollout_sampling
from graft.seeds import step_seed
from graft.trainer.loop import setup

ROLLOUT_KEYS = ("seconds", "tokens", "tokens_per_s", "peak_rss_gb")
BF16_KEYS = ("recompute_s", "tokens_per_s_with_recompute", "logprob_gap_mean", "logprob_gap_max")


def generated_lengths(gen: torch.Tensor, stop_ids: set[int], pad_id: int) -> list[int]:
    """Tokens of each ``model.generate`` row [B, T] up to and including its first stop token; a row
    without one ends at its first pad (cut by a stop string) or runs the full width."""
    stops = torch.tensor(sorted(stop_ids), dtype=gen.dtype, device=gen.device)
    out = []
    for row in gen:
        hit = torch.isin(row, stops).nonzero()
        if len(hit):
            out.append(int(hit[0]) + 1)
            continue
        pad = (row == pad_id).nonzero()
        out.append(int(pad[0]) if len(pad) else row.numel())
    return out


@torch.no_grad()
def hf_generate(policy, prompt_ids: list[list[int]], params: SamplingParams) -> int:
    """``params.n`` samples per prompt with plain ``model.generate`` (``params.batch_size`` sequences per call,
    prompts left-padded, ended at ``params.stop_strings``; the global torch seed draws); returns the number of
    generated tokens."""
    n, per_call = params.n, max(1, params.batch_size // params.n)
    extra = {"stop_strings": list(params.stop_strings), "tokenizer": policy.tokenizer} if params.stop_strings else {}
    tokens = 0
    for s in range(0, len(prompt_ids), per_call):
        chunk = prompt_ids[s : s + per_call]
        L = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), L), policy.pad_token_id, dtype=torch.long)
        attn = torch.zeros((len(chunk), L), dtype=torch.long)
        for b, p in enumerate(chunk):
            ids[b, L - len(p) :] = torch.tensor(p)
            attn[b, L - len(p) :] = 1
        out = policy.model.generate(
            input_ids=ids.to(policy.device),
            attention_mask=attn.to(policy.device),
            do_sample=True,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=0,
            max_new_tokens=params.max_new_tokens,
            num_return_sequences=n,
            pad_token_id=policy.pad_token_id,
            eos_token_id=sorted(policy.stop_ids),
            **extra,
        )
        tokens += sum(generated_lengths(out[:, L:], policy.stop_ids, policy.pad_token_id))
    return tokens


def _rate(seconds: float, tokens: int) -> dict:
    """A rollout row: seconds, tokens and tokens per second."""
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / max(seconds, 1e-9)}


def _graft_rollout(learner, prompts, cfg: Config, name: str, i: int) -> dict:
    """Repetition ``i`` of graft's sampler."""
    t0 = time.perf_counter()
    groups, _ = learner.rollout(prompts, cfg.rollout, i + 1, step_seed(cfg.seed, i + 1, name))
    return _rate(time.perf_counter() - t0, sum(len(t) for g in groups for t in g.token_ids))


def _generate_rollout(policy, prompt_ids: list[list[int]], cfg: Config, name: str, params: SamplingParams, i: int) -> dict:
    """Repetition ``i`` of ``model.generate`` with graft's sampling settings ``params``."""
    torch.manual_seed(step_seed(cfg.seed, i + 1, name))
    t0 = time.perf_counter()
    tokens = hf_generate(policy, prompt_ids, params)
    return _rate(time.perf_counter() - t0, tokens)


def _bf16_rollout(learner, prompts, cfg: Config, name: str, i: int) -> dict:
    """Repetition ``i`` of graft's sampler on the bf16 copy, then the fp32 recompute of its log-probs."""
    rc = cfg.rollout
    learner.workers.call("set_engine", [("hf-bf16",)], "set_engine")  # the bf16 copy, untimed
    try:
        t0 = time.perf_counter()
        groups, _ = learner.rollout(prompts, rc, i + 1, step_seed(cfg.seed, i + 1, name))
        t1 = time.perf_counter()
        gap = learner.recompute_old_logprobs(groups, cfg.update, rc.temperature)
        t2 = time.perf_counter()
    finally:
        learner.workers.call("set_engine", [("hf",)], "set_engine")
    tokens = sum(len(t) for g in groups for t in g.token_ids)
    return _rate(t1 - t0, tokens) | {
        "recompute_s": t2 - t1,
        "tokens_per_s_with_recompute": tokens / (t2 - t0),
        "logprob_gap_mean": gap["logprob_gap/mean_abs"],
        "logprob_gap_max": gap["logprob_gap/max_abs"],
    }


def _generate_kwargs(params: SamplingParams, policy) -> dict:
    """The ``model.generate`` settings of (b), for the JSON."""
    return {
        "do_sample": True,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": 0,
        "max_new_tokens": params.max_new_tokens,
        "num_return_sequences": params.n,
        "eos_token_id": sorted(policy.stop_ids),
        "stop_strings": list(params.stop_strings or ()),
        "prompts_per_call": max(1, params.batch_size // params.n),
    }


def _bench_model(run, cfg: Config, entry: ModelConfig, reps: int) -> dict:
    """(b) on the one model of ``run``: its three sides alternating on one batch of prompts."""
    prompts, _ = run.sampler.next_batch()
    learner = run.learners[entry.name]
    policy = learner.policy
    prompt_ids = [learner.codec.encode_prompt(p.problem, p.messages) for p in prompts]
    stops = entry.stop_strings()
    params = replace(rollout_sampling(cfg.rollout), stop_strings=tuple(stops))
    sides = [
        ("graft", partial(_graft_rollout, learner, prompts, cfg, entry.name)),
        ("graft_bf16", partial(_bf16_rollout, learner, prompts, cfg, entry.name)),
        ("generate", partial(_generate_rollout, policy, prompt_ids, cfg, entry.name, params)),
    ]
    rows = alternate(
        reps, sides, f"b {entry.name}", lambda r: f"{r['seconds']:.1f} s, {r['tokens']} tokens, {r['tokens_per_s']:.1f} tok/s"
    )
    return {
        "name": entry.name,
        "template": entry.template,
        "stop_strings": stops,
        "graft": summarize(rows["graft"], ROLLOUT_KEYS) | {"raw": rows["graft"]},
        "graft_bf16": summarize(rows["graft_bf16"], ROLLOUT_KEYS + BF16_KEYS) | {"raw": rows["graft_bf16"]},
        "generate": summarize(rows["generate"], ROLLOUT_KEYS) | {"raw": rows["generate"]},
        "generate_kwargs": _generate_kwargs(params, policy),
    }


def bench_b(base: Config, models: tuple[str, ...], reps: int, run_root: Path) -> dict:
    """Part (b) for every model of ``models``, one loaded at a time."""
    out = {}
    for k, path in enumerate(models):
        entry = model_entry(base, path)
        cfg = single_model_config(base, entry, run_root / f"b{k}")
        progress(f"(b) loading {path}")
        run = setup(cfg)
        try:
            out[path] = _bench_model(run, cfg, entry, reps)
        finally:
            close_run(run)
            del run
            gc.collect()
    return out
