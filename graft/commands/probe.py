"""``graft probe``: will GRAFT help this pair? A step-0 probe of a config's models on its training task.

    graft probe CONFIG.yaml [--prompts 64] [--compat] [--checkpoint STEP_DIR] [--batch-prompts 8 16]
                [--out FILE] [key=value ...]

Samples ``rollout.n`` responses per prompt from every model of the config on the first ``--prompts``
training prompts (the same engine, seeds, templates, stop strings and grader as training, no update)
and reports:

- per model: mean reward, share of prompts with >= 1 success, all-fail share, share of responses with
  a ``\\boxed{}`` answer;
- complementarity of every ordered pair (spec §1: the share of the receiver's all-fail prompts the
  source solved), an N x N matrix for N models, and per problem family for a family mixture;
- with ``--compat``: the compatibility ``s`` of every response handed to every other model, scored by
  the exchange's own code (quantiles, share admitted at ``exchange.delta``, for all and for correct ones);
- the **predicted exchange per training step** at the configured ``batch_prompts``: the probed prompts
  are partitioned into batches of ``batch_prompts`` (``--resamples`` seeded shuffles), and each batch
  goes through the exchange of training (:func:`graft.exchange.live.exchange_live` with ``--compat``,
  the receivers' log-probs replayed from the probe; :func:`graft.exchange.live.select` without): per
  direction the mean candidates, balanced m, kept prompts, transferred and admitted responses (and
  admitted correct ones), and the share of steps that exchange anything; plus a one-line verdict when
  the pair would exchange (almost) nothing. It models the GRAFT exchange of ``update.rule`` graft/luffy/sgt
  (HACPO shares groups by its own rule, which is not predicted). ``--batch-prompts 8 16 ...`` predicts it at
  each of those batch sizes from the same samples (``predicted_exchange_by_batch``), with the admitted correct
  responses per 100 training prompts so that sizes compare at an equal prompt budget.
- with three or more models and ``--compat``: what each ``exchange.pairing`` chooses (``pairing``): the same
  replay under every registered pairing, the batches taken as consecutive steps of one pairing window, with the
  share of steps each receiver drew from each source and what it admitted.

``--checkpoint RUN/checkpoints/step_N`` loads each model's weights of that checkpoint (to measure ``s``
along a run). Prints JSON, then short tables; ``--out`` writes the JSON to a file, ``--samples`` every graded
response as JSON lines (to read what the models write, e.g. the rewarded ones). Per model, ``statuses`` counts
the grader's statuses (for the code task, ``holdout_fail``: rewarded programs that fail fresh inputs).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import torch

from graft.algos.gating import gate_metrics
from graft.commands.parsers import probe_parser
from graft.config import ConfigError, load_config
from graft.console import bars, quiet_bars
from graft.data.datasets import PromptSampler
from graft.data.tasks import family_of, task_families
from graft.domains.grading import load_data, make_grader
from graft.exchange.common import adv_norm, complementarity, counts
from graft.exchange.handover import Scoring, hand_over
from graft.exchange.live import exchange_live, select
from graft.exchange.pairing import PairingWindow
from graft.policy.context import check_learner_context
from graft.policy.prompts import check_conversations
from graft.registry import PAIRINGS
from graft.seeds import step_seed
from graft.storage.checkpoint import CheckpointError, load_checkpoint
from graft.success import succeeded
from graft.trainer.learner import Learner
from graft.trainer.metrics import group_stats
from graft.types import ExchangeResult, Prompt, RolloutGroup

ALMOST_NOTHING = 1.0
"""The verdict fires when no direction is predicted to admit (or, without ``--compat``, keep) at least this
many responses (prompts) per step on average."""


def probe_main(argv: Sequence[str] | None = None) -> int:
    args = probe_parser().parse_intermixed_args(argv)
    results = probe(
        args.config,
        list(args.overrides),
        prompts=args.prompts,
        seed=args.seed,
        compat=args.compat,
        checkpoint=args.checkpoint,
        resamples=args.resamples,
        batch_sizes=args.batch_prompts,
        samples=args.samples,
    )
    print(json.dumps(results, indent=2))
    print(tables(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


def probe(
    config: str,
    overrides: list[str],
    prompts: int = 64,
    seed: int = 0,
    compat: bool = False,
    checkpoint: str | None = None,
    resamples: int = 8,
    batch_sizes: list[int] | None = None,
    samples: str | None = None,
) -> dict:
    """The probe's results as a JSON-ready dict (module docstring); with ``samples``, every graded response
    written there as JSON lines (:func:`write_samples`)."""

    cfg = load_config(config, overrides)
    if prompts < 1 or resamples < 1:
        raise ConfigError(f"--prompts and --resamples must be >= 1, got {prompts} and {resamples}")
    if batch_sizes is not None and min(batch_sizes) < 1:
        raise ConfigError(f"--batch-prompts must be >= 1, got {batch_sizes}")
    weights = _checkpoint_dirs(checkpoint, [m.name for m in cfg.models])
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if not bars(cfg.progress):
        quiet_bars()  # the hub's and transformers' weight-loading bars too
    train, _ = load_data(cfg.data.train, cfg)
    check_conversations(cfg.models, train, "data.train")
    batch, _ = PromptSampler(train, min(prompts, len(train)), seed, True).next_batch()
    results: dict = {
        "config": config,
        "overrides": list(overrides),
        "checkpoint": checkpoint,
        "prompts": len(batch),
        "n": cfg.rollout.n,
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "models": {},
        "complementarity": {},
    }
    groups, learners = _sample_models(cfg, batch, weights, seed, compat, results["models"])
    if samples:
        write_samples(groups, samples)
    names, threshold = list(groups), cfg.reward.success_threshold
    for s in names:
        for r in names:
            if s != r:
                results["complementarity"][f"{s}->{r}"] = complementarity(
                    counts(groups[s], threshold), counts(groups[r], threshold)
                )
                if compat:
                    results.setdefault("compat", {})[f"{s}->{r}"] = _compat(groups[s], learners[r], cfg)
    if task_families(cfg) is not None:
        results["families"] = _by_family(groups, threshold)
    results |= _predictions(groups, cfg, learners or None, resamples, seed, batch_sizes)
    return results


def _sample_models(
    cfg, batch: list[Prompt], weights: dict[str, Path], seed: int, compat: bool, stats: dict
) -> tuple[dict[str, list[RolloutGroup]], dict[str, ReplayReceiver]]:
    """Every model's graded rollout of ``batch`` (its statistics into ``stats``), and with ``compat`` each
    model as a :class:`ReplayReceiver`."""
    groups, learners = {}, {}
    with make_grader(cfg.reward) as grader:
        for m in cfg.models:
            t0 = time.perf_counter()
            learner = Learner.local(m, weights_from=weights.get(m.name))
            check_learner_context(learner, batch, cfg.rollout.max_new_tokens)
            gs, gen = learner.rollout(batch, cfg.rollout, 0, step_seed(seed, 0, m.name), progress=bars(cfg.progress))
            texts = [r for g in gs for r in g.responses]
            ids = [t for g in gs for t in g.token_ids]
            rewards, statuses = grader.grade(texts, [g.answer for g in gs for _ in g.responses], completion_ids=ids)
            for i, g in enumerate(gs):
                g.rewards, g.status = rewards[i * g.size : (i + 1) * g.size], statuses[i * g.size : (i + 1) * g.size]
                g.advantages = [0.0] * g.size  # the exchange copies the source's advantages; any values do here
            st = group_stats(gs, cfg.reward.success_threshold)
            stats[m.name] = {
                "template": m.template,
                "reward_mean": st["reward/mean"],
                "prompts_solved": sum(g.successes(cfg.reward.success_threshold) > 0 for g in gs) / len(gs),
                "all_fail_frac": st["all_fail_frac"],
                "all_correct_frac": st["all_correct_frac"],
                "boxed_frac": 1 - st["verify/no_answer"] / len(texts),
                "seconds": time.perf_counter() - t0,
                "tokens_per_s": gen["tokens_per_s/rollout"],
                "statuses": dict(sorted(Counter(s for g in gs for s in g.status).items())),
            }
            groups[m.name] = gs
            if compat:
                learners[m.name] = ReplayReceiver(learner)
            else:
                del learner
    return groups, learners


def write_samples(groups: dict[str, list[RolloutGroup]], path: str) -> None:
    """Every graded response of every model, one JSON object a line: model, prompt id, sample index, reward,
    status, response text."""
    with open(path, "w") as f:
        for name, gs in groups.items():
            for g in gs:
                for i, text in enumerate(g.responses):
                    row = {"model": name, "id": g.prompt_id, "i": i, "reward": g.rewards[i], "status": g.status[i]}
                    f.write(json.dumps(row | {"response": text}) + "\n")


def _predictions(
    groups: dict[str, list[RolloutGroup]], cfg, receivers: dict | None, resamples: int, seed: int, batch_sizes: list[int] | None
) -> dict:
    """The probe's predicted exchange at ``batch_prompts`` (and at each of ``batch_sizes``) and, with three or
    more models, per pairing (:func:`predict_exchange`, :func:`predict_pairings`)."""
    out: dict = {}
    sizes = dict.fromkeys([cfg.batch_prompts, *(batch_sizes or [])])
    by_size = {b: predict_exchange(groups, cfg, receivers, resamples, seed, batch_prompts=b) for b in sizes}
    out["predicted_exchange"] = by_size[cfg.batch_prompts]
    out |= predict_pairings(groups, cfg, receivers, resamples, seed)
    if batch_sizes:
        out["predicted_exchange_by_batch"] = {str(b): by_size[b] for b in dict.fromkeys(batch_sizes)}
    return out


def _checkpoint_dirs(checkpoint: str | None, names: list[str]) -> dict[str, Path]:
    """Model name -> its folder in the checkpoint ``checkpoint`` (verified against the manifest's sizes)."""
    if checkpoint is None:
        return {}

    ck = load_checkpoint(checkpoint)
    missing = [n for n in names if n not in ck.model_dirs]
    if missing:
        raise CheckpointError(
            f"--checkpoint {checkpoint} holds no model {', '.join(missing)} (it holds {', '.join(ck.model_dirs) or 'none'})"
        )
    return {n: ck.model_dirs[n] for n in names}


class ReplayReceiver:
    """A receiver (``graft.exchange.handover.Receiver``) that forwards once: the log-probs it computes are kept
    by (prompt ids, response ids) and replayed when the same text is scored again, so every batch of the
    predicted exchange is scored exactly as the full probe was."""

    def __init__(self, learner) -> None:
        self.learner, self.name, self.codec = learner, learner.name, learner.codec
        self.cache: dict = {}

    def token_logprobs(self, prompt_ids, response_ids, chunk, micro_batch, temperature, progress=False):
        keys = [(tuple(p), tuple(r)) for p, r in zip(prompt_ids, response_ids, strict=True)]  # a response per prompt
        todo = [i for i, k in enumerate(keys) if k not in self.cache]
        if todo:
            fresh = self.learner.token_logprobs(
                [prompt_ids[i] for i in todo],
                [response_ids[i] for i in todo],
                chunk=chunk,
                micro_batch=micro_batch,
                temperature=temperature,
                progress=progress,
            )
            self.cache.update({keys[i]: lp for i, lp in zip(todo, fresh, strict=True)})
        return [self.cache[k] for k in keys]


def _compat(groups: list[RolloutGroup], receiver, cfg) -> dict:
    """Gate metrics (``gating.gate_metrics``) of every response of ``groups`` handed to ``receiver``
    by the exchange's own code, for all responses and for the correct ones (above ``reward.success_threshold``)."""

    threshold = cfg.reward.success_threshold
    audit = hand_over(groups, receiver, cfg.exchange, Scoring.of(cfg), threshold=threshold).rows
    s = torch.tensor([a["s"] for a in audit])
    admitted = torch.tensor([a["admitted"] for a in audit], dtype=torch.bool)
    correct = torch.tensor([succeeded(a["reward_source"], threshold) for a in audit], dtype=torch.bool)
    return {"delta": cfg.exchange.delta, "all": gate_metrics(s, admitted), "correct": gate_metrics(s[correct], admitted[correct])}


def batches(P: int, size: int, resamples: int, seed: int) -> list[list[int]]:
    """Index lists of the training-step batches the prediction replays: ``resamples`` seeded permutations of
    the P probed prompts, each cut into P // size batches of ``size`` (the remainder is dropped); one batch of
    all P when P < size."""
    if P < size:
        return [list(range(P))]
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(resamples):
        perm = torch.randperm(P, generator=g).tolist()
        out += [perm[i : i + size] for i in range(0, P - size + 1, size)]
    return out


def predict_exchange(
    groups: dict[str, list[RolloutGroup]],
    cfg,
    receivers: dict | None,
    resamples: int,
    seed: int,
    batch_prompts: int | None = None,
    pairing: str | None = None,
) -> dict:
    """Predicted exchange per training step at ``batch_prompts`` (default ``cfg.batch_prompts``; module
    docstring): per direction ``S->R`` the mean over the replayed batches of candidates, m, kept prompts and,
    with ``receivers`` (``--compat``), transferred, admitted and admitted-correct responses (and the latter per
    100 training prompts), and the share of steps with any exchange; and a ``verdict`` (None unless the pair
    would exchange almost nothing). ``pairing`` (with ``receivers``; default ``exchange.pairing``): the replayed
    batches are consecutive steps of one pairing window, and ``paired`` is the share of steps R drew from S."""

    names = list(groups)
    P = len(groups[names[0]])
    size = min(P, batch_prompts or cfg.batch_prompts)
    plan = batches(P, size, resamples, seed)
    gen = torch.Generator().manual_seed(seed)
    ex = replace(cfg.exchange, pairing=pairing or cfg.exchange.pairing)
    window = PairingWindow(ex.pairing_window)
    rows: dict[str, list[dict]] = {f"{s}->{r}": [] for s in names for r in names if s != r}
    for step, idx in enumerate(plan):
        sub = {n: [groups[n][i] for i in idx] for n in names}
        if receivers is None:
            step_rows = _selected_rows(sub, cfg, gen)
        else:
            res = exchange_live(
                step,
                sub,
                receivers,
                cfg.rollout.n,
                ex,
                Scoring.of(cfg),
                lambda peers: None,
                gen,
                adv_norm(cfg.update),
                window,
                threshold=cfg.reward.success_threshold,
            )
            step_rows = _exchanged_rows(res, ex.pairing, cfg.reward.success_threshold)
        for d, row in step_rows:
            rows[d].append(row)
    key = "admitted" if receivers is not None else "kept_prompts"
    directions = _direction_means(rows, key, size)
    return {
        "batch_prompts": size,
        "batches": len(plan),
        "counted": key,
        "directions": directions,
        "verdict": verdict(directions, key, size),
    }


def _selected_rows(sub: dict[str, list[RolloutGroup]], cfg, gen: torch.Generator) -> list[tuple[str, dict]]:
    """Per direction of one replayed step's selection (:func:`graft.exchange.live.select`, without ``s``), its
    candidates, m and kept prompts."""
    k = {n: counts(gs, cfg.reward.success_threshold) for n, gs in sub.items()}
    cand, keep, m = select(k, cfg.rollout.n, cfg.exchange, gen)
    return [
        (f"{s}->{r}", {"candidates": int(cand[s, r].sum()), "m": m[s, r], "kept_prompts": int(keep[s, r].sum())})
        for (s, r) in cand
    ]


def _exchanged_rows(res: ExchangeResult, pairing: str, threshold: float) -> list[tuple[str, dict]]:
    """Per direction of one replayed step's exchange, its numbers (``paired`` unless ``pairing`` is ``all``;
    ``admitted_correct``: rewards above ``threshold``)."""
    out = []
    for rec in res.audit:
        d = f"{rec['source']}->{rec['receiver']}"
        pre = f"exchange/{d}"
        out.append(
            (
                d,
                {
                    "candidates": res.metrics[f"{pre}/candidates"],
                    "m": res.metrics[f"{pre}/m"],
                    "kept_prompts": res.metrics[f"{pre}/kept_prompts"],
                    "transferred": res.metrics[f"{pre}/transferred"],
                    "admitted": res.metrics[f"{pre}/admitted"],
                    "admitted_correct": sum(x["admitted"] and succeeded(x["reward_source"], threshold) for x in rec["responses"]),
                    **({} if pairing == "all" else {"paired": res.metrics[f"{pre}/paired"]}),
                },
            )
        )
    return out


def _direction_means(rows: dict[str, list[dict]], key: str, size: int) -> dict[str, dict]:
    """Per direction, the mean of each number over the replayed steps, the share of steps whose ``key`` is
    positive, and (with ``--compat``) the admitted correct responses per 100 training prompts (batches of ``size``)
    and the share of steps that admit at least one correct response."""
    directions = {
        d: {**{k: sum(x[k] for x in xs) / len(xs) for k in xs[0]}, "steps_exchanging": sum(x[key] > 0 for x in xs) / len(xs)}
        for d, xs in rows.items()
    }
    for d, v in directions.items():
        if "admitted_correct" in v:
            v["admitted_correct_per_100_prompts"] = 100 * v["admitted_correct"] / size
            v["steps_admitting_correct"] = sum(x["admitted_correct"] > 0 for x in rows[d]) / len(rows[d])
    return directions


def predict_pairings(groups: dict[str, list[RolloutGroup]], cfg, receivers: dict | None, resamples: int, seed: int) -> dict:
    """With three or more models, ``{"pairing": ...}``: with ``receivers`` (``--compat``; a pairing may read ``s``)
    the predicted exchange at ``batch_prompts`` under every pairing of :data:`graft.registry.PAIRINGS`
    (``exchange.pairing``), the replayed batches being consecutive steps of one window of
    ``exchange.pairing_window``; None without. With two models (nothing to choose): ``{}``."""
    if len(groups) < 3:
        return {}
    return {
        "pairing": None
        if receivers is None
        else {name: predict_exchange(groups, cfg, receivers, resamples, seed, pairing=name) for name in PAIRINGS}
    }


def verdict(directions: dict[str, dict], key: str, batch_prompts: int) -> str | None:
    """One line when no direction reaches :data:`ALMOST_NOTHING` ``key`` per step on average, else None."""
    best = max(directions.values(), key=lambda d: d[key], default=None)
    if best is None or best[key] >= ALMOST_NOTHING:
        return None
    what = "admitted responses" if key == "admitted" else "kept prompts"
    per = ", ".join(f"{d} {v[key]:.2f}" for d, v in directions.items())
    return (
        f"this pair will exchange almost nothing at batch_prompts={batch_prompts}: {what} per step {per}; "
        "GRAFT would train like GRPO (raise batch_prompts, pick a task both models half-solve, or lower "
        "exchange.delta)"
    )


def _by_family(groups: dict, threshold: float) -> dict:
    """Per problem family (the ``FAMILY-00017`` ids of a family mixture): mean reward of every model and
    complementarity of every ordered pair."""

    names = list(groups)
    fams = sorted({family_of(g.prompt_id) for g in groups[names[0]]})
    out = {}
    for fam in fams:
        sub = {n: [g for g in gs if family_of(g.prompt_id) == fam] for n, gs in groups.items()}
        out[fam] = {
            "prompts": len(sub[names[0]]),
            **{
                n: {"reward_mean": sum(r for g in gs for r in g.rewards) / max(1, sum(g.size for g in gs))}
                for n, gs in sub.items()
            },
            "complementarity": {
                f"{s}->{r}": complementarity(counts(sub[s], threshold), counts(sub[r], threshold))
                for s in names
                for r in names
                if s != r
            },
        }
    return out


def _pct(v: float) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1%}"


def tables(results: dict) -> str:
    """The short tables printed after the JSON."""
    names = list(results["models"])
    lines = [
        "",
        "| model | template | mean reward | prompts solved (>=1 of n) | all-fail prompts | boxed answers |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results["models"].items():
        lines.append(
            f"| {name} | {r['template']} | {_pct(r['reward_mean'])} | {_pct(r['prompts_solved'])} | "
            f"{_pct(r['all_fail_frac'])} | {_pct(r['boxed_frac'])} |"
        )
    lines += [
        "",
        "complementarity (row: source, column: receiver; share of the receiver's all-fail prompts the source solved)",
        "",
        "| source \\ receiver | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for s in names:
        lines.append(
            f"| {s} | " + " | ".join("—" if s == r else _pct(results["complementarity"][f"{s}->{r}"]) for r in names) + " |"
        )
    for k, c in results.get("compat", {}).items():
        q = lambda m: f"{m['s_p10']:.2f}/{m['s_p50']:.2f}/{m['s_p90']:.2f}"  # noqa: E731
        lines.append(
            f"s {k} (δ = {c['delta']}): all responses p10/p50/p90 {q(c['all'])}, "
            f"{c['all']['admitted_frac']:.0%} admitted; correct ones {q(c['correct'])}, "
            f"{c['correct']['admitted_frac']:.0%} admitted (n = {c['correct']['transferred']})"
        )
    if results.get("families") and len(names) >= 2:
        a, b = names[:2]
        lines += [
            "",
            f"| family | prompts | {a} reward | {b} reward | {a} solves {b}'s all-fail | {b} solves {a}'s all-fail |",
            "|---|---|---|---|---|---|",
        ]
        for fam, r in results["families"].items():
            lines.append(
                f"| {fam} | {r['prompts']} | {_pct(r[a]['reward_mean'])} | {_pct(r[b]['reward_mean'])} | "
                f"{_pct(r['complementarity'][f'{a}->{b}'])} | {_pct(r['complementarity'][f'{b}->{a}'])} |"
            )
    predictions = [results["predicted_exchange"]]
    predictions += [
        pe
        for pe in results.get("predicted_exchange_by_batch", {}).values()
        if pe["batch_prompts"] != predictions[0]["batch_prompts"]
    ]
    for pe in predictions:
        lines += _prediction_table(pe)
    if "pairing" in results:
        lines += _pairing_table(results["pairing"])
    return "\n".join(lines)


def _pairing_table(pairing: dict | None) -> list[str]:
    """Per direction and pairing: the share of replayed steps the receiver drew from the source, and the admitted
    (correct) responses per step."""
    if pairing is None:
        return ["", "(what each exchange.pairing chooses needs --compat: a pairing may read s)"]
    first = next(iter(pairing.values()))
    lines = [
        "",
        f"exchange.pairing at batch_prompts={first['batch_prompts']} over {first['batches']} replayed steps: "
        "share of steps the receiver drew from the source / admitted / admitted correct per step",
        "",
        "| direction | " + " | ".join(pairing) + " |",
        "|---|" + "---:|" * len(pairing),
    ]
    for d in first["directions"]:
        cells = [pe["directions"][d] for pe in pairing.values()]
        lines.append(
            f"| {d} | "
            + " | ".join(f"{c.get('paired', 1.0):.0%} / {c['admitted']:.2f} / {c['admitted_correct']:.2f}" for c in cells)
            + " |"
        )
    return lines


def _prediction_table(pe: dict) -> list[str]:
    cols = ["candidates", "m", "kept_prompts", "transferred", "admitted", "admitted_correct", "admitted_correct_per_100_prompts"]
    cols = [c for c in cols if c in next(iter(pe["directions"].values()), {})]
    lines = [
        "",
        f"predicted exchange per step at batch_prompts={pe['batch_prompts']} (mean over {pe['batches']} "
        f"replayed batches of the probed prompts)",
        "",
        "| direction | " + " | ".join(cols) + " | steps exchanging | steps admitting correct |",
        "|---|" + "---:|" * (len(cols) + 2),
    ]
    for d, v in pe["directions"].items():
        share = v.get("steps_admitting_correct")
        lines.append(
            f"| {d} | "
            + " | ".join(f"{v[c]:.2f}" for c in cols)
            + f" | {v['steps_exchanging']:.0%} | {'—' if share is None else f'{share:.0%}'} |"
        )
    if "admitted" not in cols:
        lines.append("(admitted responses need --compat)")
    if pe["verdict"]:
        lines += ["", f"verdict: {pe['verdict']}"]
    return lines


if __name__ == "__main__":
    sys.exit(probe_main())
