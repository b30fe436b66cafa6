"""Step-0 probe of a config's models on its training task: solve rates and complementarity.

    python scripts/probe_task.py configs/default.yaml --prompts 64 [key=value ...]

Samples ``rollout.n`` responses per prompt from every model of the config (the same sampler,
templates and grader as training, no update), then prints per model the mean reward, the share
of prompts with at least one success, the share of all-fail prompts, the share of responses
with a ``\\boxed{}`` answer, and for each direction the share of the receiver's all-fail prompts
that the source solved (spec §1 complementarity), and — with ``--compat`` — the compatibility
score ``s`` of every response handed to the other model (quantiles, share above the config's
δ, for all responses and for correct ones). Writes the numbers as JSON with ``--out``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("config")
    p.add_argument("--prompts", type=int, default=64, help="how many training prompts to probe")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--compat", action="store_true", help="also score every response under the other model (s)")
    p.add_argument("overrides", nargs="*")
    args = p.parse_intermixed_args(argv)

    from graft.config import load_config
    from graft.data.datasets import PromptSampler, load_prompts
    from graft.exchange.live import complementarity, counts
    from graft.policy.context import check_learner_context
    from graft.reward.grader import Grader
    from graft.trainer.learner import Learner
    from graft.trainer.metrics import group_stats
    from graft.trainer.loop import step_seed

    cfg = load_config(args.config, args.overrides)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    prompts, _ = load_prompts(cfg.data.train, cfg.data.on_bad_row, cfg.data.arithmetic)
    batch, _ = PromptSampler(prompts, min(args.prompts, len(prompts)), args.seed, True).next_batch()
    results: dict = {"config": args.config, "overrides": list(args.overrides), "prompts": len(batch), "n": cfg.rollout.n,
                     "max_new_tokens": cfg.rollout.max_new_tokens, "models": {}, "complementarity": {}}
    groups, learners = {}, {}
    from graft.reward.worker import VERIFY_FNS
    with Grader(cfg.reward.timeout_s, cfg.reward.workers, verify_fn=VERIFY_FNS[cfg.reward.answer_form]) as grader:
        for m in cfg.models:
            t0 = time.perf_counter()
            learner = Learner.local(m)
            check_learner_context(learner, batch, cfg.rollout.max_new_tokens)
            gs, gen = learner.rollout(batch, cfg.rollout, 0, step_seed(args.seed, 0, m.name), progress=True)
            texts = [r for g in gs for r in g.responses]
            rewards, statuses = grader.grade(texts, [g.answer for g in gs for _ in g.responses])
            for i, g in enumerate(gs):
                g.rewards, g.status = rewards[i * g.size:(i + 1) * g.size], statuses[i * g.size:(i + 1) * g.size]
            st = group_stats(gs)
            results["models"][m.name] = {
                "template": m.template, "reward_mean": st["reward/mean"],
                "prompts_solved": sum(g.num_correct > 0 for g in gs) / len(gs),
                "all_fail_frac": st["all_fail_frac"], "all_correct_frac": st["all_correct_frac"],
                "boxed_frac": 1 - st["verify/no_answer"] / len(texts), "seconds": time.perf_counter() - t0,
                "tokens_per_s": gen["tokens_per_s/rollout"],
            }
            groups[m.name] = gs
            if args.compat:
                learners[m.name] = learner
            else:
                del learner
    names = list(groups)
    for s in names:
        for r in names:
            if s != r:
                results["complementarity"][f"{s}->{r}"] = complementarity(counts(groups[s]), counts(groups[r]))
                if args.compat:
                    results.setdefault("compat", {})[f"{s}->{r}"] = _compat(groups[s], learners[r], cfg)
    if cfg.data.arithmetic.families and cfg.data.train == "arithmetic":
        results["families"] = _by_family(groups)
    print(json.dumps(results, indent=2))
    print("\n| model | template | mean reward | prompts solved (>=1 of n) | all-fail prompts | boxed answers |")
    print("|---|---|---|---|---|---|")
    for name, r in results["models"].items():
        print(f"| {name} | {r['template']} | {r['reward_mean']:.1%} | {r['prompts_solved']:.1%} | "
              f"{r['all_fail_frac']:.1%} | {r['boxed_frac']:.1%} |")
    for k, v in results["complementarity"].items():
        s, r = k.split("->")
        print(f"\n{s} solves {v:.1%} of {r}'s all-fail prompts", end="")
    print()
    if len(names) > 2:
        print("\ncomplementarity matrix (row: source, column: receiver)\n")
        print("| source \\ receiver | " + " | ".join(names) + " |\n|---|" + "---:|" * len(names))
        for s in names:
            print(f"| {s} | " + " | ".join("—" if s == r else f"{results['complementarity'][f'{s}->{r}']:.1%}"
                                          for r in names) + " |")
    for k, c in results.get("compat", {}).items():
        q = lambda m: f"{m['s_p10']:.2f}/{m['s_p50']:.2f}/{m['s_p90']:.2f}"  # noqa: E731
        print(f"s {k} (δ = {c['delta']}): all responses p10/p50/p90 {q(c['all'])}, {c['all']['admitted_frac']:.0%} admitted; "
              f"correct ones {q(c['correct'])}, {c['correct']['admitted_frac']:.0%} admitted (n = {c['correct']['transferred']})")
    if results.get("families"):
        a, b = names[:2]
        print(f"\n| family | prompts | {a} reward | {b} reward | {a} solves {b}'s all-fail | {b} solves {a}'s all-fail |")
        print("|---|---|---|---|---|---|")
        for fam, r in results["families"].items():
            f = lambda v: "n/a" if v != v else f"{v:.0%}"  # noqa: E731
            print(f"| {fam} | {r['prompts']} | {f(r[a]['reward_mean'])} | {f(r[b]['reward_mean'])} | "
                  f"{f(r['complementarity'][f'{a}->{b}'])} | {f(r['complementarity'][f'{b}->{a}'])} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def _by_family(groups: dict) -> dict:
    """Per problem family (the ``FAMILY-00017`` ids of a family mixture): mean reward of every model and
    complementarity of every ordered pair."""
    from graft.data.arithmetic import family_of
    from graft.exchange.live import complementarity, counts

    names = list(groups)
    fams = sorted({family_of(g.prompt_id) for g in groups[names[0]]})
    out = {}
    for fam in fams:
        sub = {n: [g for g in gs if family_of(g.prompt_id) == fam] for n, gs in groups.items()}
        out[fam] = {"prompts": len(sub[names[0]]),
                    **{n: {"reward_mean": sum(r for g in gs for r in g.rewards) / max(1, sum(g.size for g in gs))}
                       for n, gs in sub.items()},
                    "complementarity": {f"{s}->{r}": complementarity(counts(sub[s]), counts(sub[r]))
                                        for s in names for r in names if s != r}}
    return out


def _compat(groups, receiver, cfg) -> dict:
    """Gate metrics (``gating.gate_metrics``) of every response of ``groups`` handed to ``receiver``
    by the exchange's own code, for all responses and for the correct ones."""
    from graft.algos.gating import gate_metrics
    from graft.exchange.handover import Scoring, hand_over

    for g in groups:   # hand_over copies the source's advantages; any values do here
        g.advantages = [0.0] * g.size
    audit = hand_over(groups, receiver, cfg.exchange, Scoring.of(cfg)).rows
    s = torch.tensor([a["s"] for a in audit])
    admitted = torch.tensor([a["admitted"] for a in audit], dtype=torch.bool)
    correct = torch.tensor([a["reward_source"] > 0.5 for a in audit], dtype=torch.bool)
    return {"delta": cfg.exchange.delta, "all": gate_metrics(s, admitted),
            "correct": gate_metrics(s[correct], admitted[correct])}


if __name__ == "__main__":
    sys.exit(main())
