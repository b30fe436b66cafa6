"""``graft onestep``: does a peer group on an all-fail prompt teach the receiver that prompt, and does it transfer?

The most sensitive test of GRAFT at this project's scale. Along a GRPO trajectory of the
configured pair (every model trained on its own groups, ``exchange.mode`` ignored), at chosen steps
the same weights, optimizer state and batch are updated three ways for each receiver R:

- ``grpo``: R's own groups, exactly the GRPO update (the one the trajectory then keeps);
- ``graft``: the same update plus the peer groups that GRAFT's exchange with the configured gate (δ,
  weights) hands to R;
- ``all``: the same with the peer groups of the exchange with the gate off (``exchange.admission=all``):
  what δ protects against.

The arms differ by the peer groups only (:func:`update_adding_peers`). Every arm's minibatches
are GRPO's: R's own groups -- all of them, including the all-fail groups the spec's exchange would drop
in favour of the peer groups -- planned with the same seed, and every minibatch's policy-gradient
normalisers (tokens, sequences) are those of R's own rows. An all-fail group has zero advantage under
GRPO, so its rows add no gradient in any arm; they count in the denominators of both arms alike. The
peer groups join the minibatch where ``update.order`` puts peer data (``peer_last``: the last,
``peer_first``: the first, ``random``: the one holding R's own group of the same prompt), after R's
rows, and are divided by that minibatch's own-row normalisers: they add gradient, not denominator. So in
every minibatch ``graft``'s loss is ``grpo``'s plus the peer rows' (and the minibatches before the peer
rows' are ``grpo``'s exactly); with no peer group the updates are bit-identical
(``tests/test_onestep.py``). Differences from GRAFT's own step, which replaces R's all-fail group by the
peer group and re-plans the minibatches: the all-fail group's tokens stay in the denominator and the
peer group's are not added to it (equal sizes: n responses each), and R's own groups keep their GRPO
minibatches. Refused where the arms could not differ by the peer groups only: a KL penalty
(``models.I.kl_coef`` > 0: its normalisers are the shard's) and ``exchange.pooled_rewards`` (which
changes R's own advantages).

R is then sampled ``--samples`` (>= 16) times on (i) the prompts whose all-fail groups the exchange
selected for replacement in direction S->R and (ii) ``--unseen`` unseen prompts of the same problem
family per selected prompt (drawn from a pool disjoint from the training prompts). Each prompt samples
from the same seeds in every arm (common random numbers), so the arms' success rates differ only where
their weights do. The outcome is the paired difference in success rate, ``graft - grpo`` and
``all - grpo``, per prompt; its 95 % intervals: a Student-t interval over the training states' mean
differences (``t95``, the one the verdict reads: :data:`VERDICT_INTERVAL`) and a percentile bootstrap over
states (seed, step) and prompts within them (``ci95``).

With ``--from RUN_DIR ...`` the states are those of finished GRPO runs instead (e.g. a study's GRPO arm):
step s starts from the run's checkpoint of step s - 1 (s = 1: the base weights), resumed exactly as
``resume=true`` would, so its batch and samples are the run's own step s and no trajectory is trained
again. The run must have saved and kept those checkpoints with their optimizer state
(``checkpoint.save_every``, ``keep_last``); its config and seed are read from its ``config.yaml``.

Outputs under ``--out``: ``rows.jsonl`` (one line per state, direction and prompt: success per arm,
kind, family, admitted and admitted-correct peer responses), ``seedS/metrics.jsonl`` (the GRPO
trajectory's rewards; not with ``--from``), ``summary.json``, ``measured.json`` (the states measured)
and ``commands.jsonl`` (each invocation's command with every state it recorded, written as it records
one: an invocation stopped after recording a state is listed too). A state already measured is skipped
when the command is run again, so a stopped measurement resumes state by state, and states of one
trajectory may be measured by several commands into the same ``--out`` (e.g. step 1 before the run
exists, later steps from its checkpoints), also at the same time (one per core: the records are written
under a lock, ``.lock``). Local backend only.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import fcntl
import json
import os
import random
import shutil
import time
from dataclasses import replace
from pathlib import Path

import torch

from graft.algos.minibatch import plan_minibatches
from graft.commands.parsers import onestep_parser
from graft.config import ConfigError, load_config
from graft.console import say
from graft.data.tasks import family_of, require_families
from graft.evaluation.analyze import read_jsonl
from graft.evaluation.metrics import paired_interval
from graft.exchange.common import adv_norm
from graft.exchange.handover import Scoring
from graft.exchange.kinds import exchange_kind
from graft.exchange.live import exchange_live
from graft.policy.sampling import rollout_sampling
from graft.seeds import step_seed
from graft.storage.checkpoint import checkpoint_step, list_checkpoints
from graft.success import succeeded
from graft.trainer import loop
from graft.trainer.batch import prepare_minibatch
from graft.types import ExchangeResult, Prompt, RolloutGroup

ARMS = ("grpo", "graft", "all")
ARMS_VERSION = 2
"""How the arms are built, in every row (``arms_version``; absent: 1). 1: ``graft``/``all`` trained on the spec's
spliced batch (R's all-fail groups replaced, peer groups last, minibatches re-planned); 2: GRPO's update plus the
peer groups (module docstring). A folder's states are not mixed across versions."""
MIN_SAMPLES = 16
"""Samples per prompt and arm the test needs at least (STUDY.md §3): 1 of 16 is a 6-point step."""
VERDICT_INTERVAL = {
    "uses": "t95",
    "why": (
        "the verdict reads t95, the Student-t interval over the states' mean differences (df = states - 1), "
        "because the states, not the prompts, are the independent units (a state's prompts share one update) and "
        "a percentile bootstrap over as few states as measured here covers less than 95 %; ci95, the cluster "
        "bootstrap, is kept beside it"
    ),
}
"""Which interval a reading of the test uses, and why (written into every summary)."""


# ----------------------------------------------------------------------------- statistics (pure)


def state_t_interval(diffs: list[tuple[tuple, float]]) -> dict:
    """Mean of the per-state means of ``diffs`` (``[(state, d), ...]``; every state weighs the same) with its
    Student-t 95 % interval, df = states - 1 (:func:`graft.evaluation.metrics.paired_interval`); one state: no
    interval.

    Hand-worked: states (1, 1): 0.5, 0.0 -> 0.25; (2, 1): 0.25; (3, 1): -0.125 -> mean (0.25 + 0.25 - 0.125) / 3
    = 0.125; sd sqrt((0.125^2 + 0.125^2 + 0.25^2) / 2) = sqrt(0.046875) = 0.216506, se 0.216506 / sqrt(3) = 0.125;
    half-width t(0.975, 2) 4.3027 * 0.125 = 0.537838 -> [-0.412838, 0.662838].
    """
    by_state: dict = {}
    for state, d in diffs:
        by_state.setdefault(state, []).append(d)
    t = paired_interval([sum(ds) / len(ds) for ds in by_state.values()])
    return {"mean": t["mean"], "ci95": t["ci95"], "sd": t["sd"], "states": t["n"]}


def paired_summary(diffs: list[tuple[tuple, float]], resamples: int = 2000, seed: int = 0) -> dict:
    """Mean of per-prompt paired differences, its 95 % cluster-bootstrap interval (``ci95``), the
    Student-t interval over state means (``t95``, :func:`state_t_interval`) and how many prompts
    differed at all (``differed``: d != 0).

    ``diffs``: ``[(state, d), ...]``, ``state`` any hashable (seed, step). States are resampled with
    replacement, then prompts within each drawn state. Hand-worked: ``[((1, 1), 0.5), ((1, 1), 0.0),
    ((2, 1), 0.25)]`` -> mean 0.25 over 3 prompts in 2 states, 2 of them differed.
    """
    if not diffs:
        return {
            "mean": None,
            "ci95": [None, None],
            "prompts": 0,
            "states": 0,
            "differed": 0,
            "t95": {"mean": None, "ci95": [None, None], "sd": None, "states": 0},
        }
    by_state: dict = {}
    for state, d in diffs:
        by_state.setdefault(state, []).append(d)
    states = list(by_state.values())
    rng = random.Random(seed)
    means = []
    for _ in range(resamples):
        pick = [states[rng.randrange(len(states))] for _ in states]
        xs = [x[rng.randrange(len(x))] for s in pick for x in [s] for _ in s]
        means.append(sum(xs) / len(xs))
    means.sort()
    lo, hi = means[int(0.025 * resamples)], means[min(resamples - 1, int(0.975 * resamples))]
    ds = [d for _, d in diffs]
    return {
        "mean": sum(ds) / len(ds),
        "ci95": [lo, hi],
        "prompts": len(ds),
        "states": len(states),
        "differed": sum(d != 0 for d in ds),
        "t95": state_t_interval(diffs),
    }


def differed_by_state(rows: list[dict]) -> list[dict]:
    """Per state (seed, step) of ``rows`` (one direction's) and prompt kind: prompts measured and how many of them
    changed success at all with each arm against ``grpo``."""
    out = []
    for seed, step in sorted({(r["seed"], r["step"]) for r in rows}):
        mine = [r for r in rows if (r["seed"], r["step"]) == (seed, step)]
        out.append(
            {
                "seed": seed,
                "step": step,
                **{
                    kind: {
                        "prompts": len(ks),
                        **{arm: sum(r["success"][arm] != r["success"]["grpo"] for r in ks) for arm in ("graft", "all")},
                    }
                    for kind in ("replaced", "unseen")
                    for ks in [[r for r in mine if r["kind"] == kind]]
                },
            }
        )
    return out


def summarize_rows(rows: list[dict]) -> dict:
    """Per direction and kind, ``graft - grpo`` and ``all - grpo`` (:func:`paired_summary`), plus the
    treatment's size: selected prompts, admitted and admitted-correct peer responses per arm; per direction
    and state, the prompts that changed at all (``differed``, :func:`differed_by_state`); which interval the
    verdict reads (``verdict_interval``) and how the rows' arms were built (``arms_version``, :data:`ARMS_VERSION`)."""
    out: dict = {
        "arms_version": sorted({r.get("arms_version", 1) for r in rows}),
        "graft_minus_grpo": {},
        "all_minus_grpo": {},
        "treatment": {},
        "differed": {},
        "verdict_interval": VERDICT_INTERVAL,
    }
    for d in sorted({r["direction"] for r in rows}):
        mine = [r for r in rows if r["direction"] == d]
        for arm in ("graft", "all"):
            out[f"{arm}_minus_grpo"][d] = {
                kind: paired_summary(
                    [((r["seed"], r["step"]), r["success"][arm] - r["success"]["grpo"]) for r in mine if r["kind"] == kind]
                )
                for kind in ("replaced", "unseen")
            }
        sel = [r for r in mine if r["kind"] == "replaced"]
        out["treatment"][d] = {
            "states": len({(r["seed"], r["step"]) for r in mine}),
            "selected_prompts": len(sel),
            **{f"admitted/{a}": sum(r["admitted"][a] for r in sel) for a in ("graft", "all")},
            **{f"admitted_correct/{a}": sum(r["admitted_correct"][a] for r in sel) for a in ("graft", "all")},
        }
        out["differed"][d] = differed_by_state(mine)
    return out


# ----------------------------------------------------------------------------- the measurement


def _snapshot(learner) -> dict:
    """The receiver's weights and optimizer state, copied once: tensors shared by several state-dict keys
    (tied embeddings: Gemma-3's 262k x 640 table) are cloned once and stay shared."""
    clones: dict[int, torch.Tensor] = {}
    weights = {
        k: clones.setdefault(id(v), v.detach().clone()) for k, v in learner.policy.model.state_dict(keep_vars=True).items()
    }
    return {"weights": weights, "optimizer": copy.deepcopy(learner.optimizer.state_dict())}


def _restore(learner, snap: dict) -> None:
    """Back to ``snap``: weights and optimizer moments copied in place."""
    learner.policy.model.load_state_dict(snap["weights"])
    learner.optimizer.restore(snap["optimizer"])
    learner.workers.call("weights_changed", [()], "weights_changed")


class PeersAdded:
    """An update rule (``run.rule``) with peer groups added to an update planned over R's own groups.

    Duck-typed for :meth:`graft.trainer.learner.Learner.update`, which calls :meth:`minibatch_weights` and then
    :meth:`loss_kwargs` once per minibatch: minibatch k gets its own groups plus ``peers_at[k]`` (after them), and
    its loss the policy-gradient normalisers (``num_tokens``, ``num_seqs``) of the own groups alone -- the values
    the GRPO update divides by (:func:`graft.trainer.batch.prepare_minibatch`, which the loss's keyword arguments
    override). The SGT normaliser (peer successes only) is left as computed.
    """

    def __init__(self, rule, peers_at: dict[int, list[RolloutGroup]]) -> None:
        self.rule, self.peers_at = rule, peers_at
        self.name, self.loss, self.supervised = rule.name, rule.loss, rule.supervised
        self._counts: tuple[float, float, float] | None = None

    def minibatch_weights(self, k: int, groups: list[RolloutGroup]) -> list[RolloutGroup]:
        out = self.rule.minibatch_weights(k, list(groups) + self.peers_at.get(k, []))
        assert len(out) == len(groups) + len(self.peers_at.get(k, [])), "a rule's minibatch_weights keeps every group"
        self._counts = prepare_minibatch(out[: len(groups)], self.rule.supervised)[1]
        return out

    def loss_kwargs(self) -> dict:
        counts, self._counts = self._counts, None
        assert counts is not None, "Learner.update calls minibatch_weights(k, ...) before loss_kwargs() in every minibatch"
        return self.rule.loss_kwargs() | {"num_tokens": counts[0], "num_seqs": counts[1]}


def peer_placement(
    own: list[RolloutGroup], plan: list[list[int]], peers: list[RolloutGroup], order: str
) -> dict[int, list[RolloutGroup]]:
    """Which minibatch of ``plan`` (over ``own``) each peer group joins, in ``peers``' order: where
    ``update.order`` puts peer data -- ``peer_last`` the last minibatch, ``peer_first`` the first, ``random``
    the one holding R's own group of the same prompt (the minibatch a random order would have put it in)."""
    if not peers or not plan:
        return {}
    if order == "peer_last":
        return {len(plan) - 1: list(peers)}
    if order == "peer_first":
        return {0: list(peers)}
    where = {own[i].prompt_id: k for k, idx in enumerate(plan) for i in idx}
    out: dict[int, list[RolloutGroup]] = {}
    for g in peers:
        out.setdefault(where[g.prompt_id], []).append(g)
    return out


def update_adding_peers(run, name: str, own: list[RolloutGroup], peers: list[RolloutGroup], step: int) -> dict:
    """``loop.update_model(run, name, own, step)`` -- the same learning rate, minibatch plan (seed and groups),
    rows and normalisers -- with ``peers`` added where :func:`peer_placement` puts them (:class:`PeersAdded`).
    With no peer group it is that update, bit for bit."""
    cfg, learner = run.cfg, run.learners[name]
    assert not any(g.is_peer for g in own) and all(g.is_peer for g in peers)
    loop.set_learning_rate(run, name, step)
    gen = torch.Generator().manual_seed(step_seed(cfg.seed, step, f"plan/{name}"))
    gs = run.rule.prepare(own)
    plan = plan_minibatches([g.is_peer for g in gs], cfg.update.num_minibatches, cfg.update.order, gen)
    rule = PeersAdded(run.rule, peer_placement(gs, plan, run.rule.prepare(peers), cfg.update.order))
    m = {}
    for _ in range(cfg.update.epochs):
        m = learner.update(gs, plan, cfg.update, cfg.rollout.temperature, rule, progress=run.bars)
    return m


def success_rates(run, learner, prompts: list[Prompt], samples: int, step: int) -> list[float]:
    """Share of ``samples`` responses of ``learner`` graded correct (a reward above ``reward.success_threshold``), per
    prompt; prompt p samples from the seed of (run seed, step, p's id) in every arm."""
    if not prompts:
        return []
    ids = [learner.codec.encode_prompt(p.problem, p.messages) for p in prompts]
    seeds = [step_seed(run.cfg.seed, step, f"onestep/{learner.name}/{p.id}") for p in prompts]
    out = learner.generate(ids, replace(rollout_sampling(run.cfg.rollout, seeds), n=samples))
    texts, ids = [s.text for ss in out for s in ss], [s.token_ids for ss in out for s in ss]
    rewards, _ = run.grader.grade(texts, [p.answer for p in prompts for _ in range(samples)], completion_ids=ids)
    ok = [succeeded(x, run.cfg.reward.success_threshold) for x in rewards]
    return [sum(ok[i * samples : (i + 1) * samples]) / samples for i in range(len(prompts))]


def unseen_pool(cfg, train: list[Prompt], per_family: int = 64) -> dict[str, list[Prompt]]:
    """Per family of the training task, up to ``per_family`` distinct problems that are not training
    problems (drawn from the family's generator with its own seed; ``square`` has few problems)."""
    task, settings = require_families(cfg, "graft onestep (unseen prompts are drawn per family)")
    seen = {p.problem for p in train}
    out: dict[str, list[Prompt]] = {}
    for fam in task.families(settings):
        rng = random.Random(f"{settings.seed}/unseen/{fam}")
        found: list[Prompt] = []
        for _ in range(50 * per_family):
            problem, answer = task.draw(settings, fam, rng) or ("", "")
            if problem and problem not in seen:
                seen.add(problem)
                found.append(Prompt(f"unseen-{fam}-{len(found):05d}", problem, answer))
                if len(found) == per_family:
                    break
        out[fam] = found
    return out


def measure_state(run, groups: dict[str, list[RolloutGroup]], step: int, pool, samples: int, unseen: int) -> list[dict]:
    """The three updates of every receiver at this state and their success rates; leaves every model
    updated with its own groups (the GRPO trajectory)."""
    names = list(run.learners)
    ex = _exchange_arms(run, groups, step)
    rng = random.Random(step_seed(run.cfg.seed, step, "onestep/unseen"))
    rows = []
    for r in names:
        targets = _targets(r, ex, groups, pool, unseen, rng, run.cfg.reward.success_threshold)
        success = _arm_success(run, r, groups, ex, [t[0] for t in targets], samples, step)
        for i, (p, kind, base) in enumerate(targets):
            rows.append(
                {
                    "step": step,
                    "prompt_id": p.id,
                    "family": family_of(p.id.removeprefix("unseen-")),
                    "kind": kind,
                    **base,
                    "success": {arm: success[arm][i] for arm in ARMS},
                    "arms_version": ARMS_VERSION,
                }
            )
    return rows


def _exchange_arms(run, groups: dict[str, list[RolloutGroup]], step: int) -> dict[str, ExchangeResult]:
    """The exchange of this state under the graft arm's admission and under ``admission=all``."""
    cfg = run.cfg
    adv = adv_norm(cfg.update)
    return {
        arm: exchange_live(
            step,
            copy.deepcopy(groups),
            run.learners,
            cfg.rollout.n,
            cfg.exchange if arm == "graft" else replace(cfg.exchange, admission="all"),
            Scoring.of(cfg),
            run.grade,
            torch.Generator().manual_seed(step_seed(cfg.seed, step, "exchange")),
            adv,
            threshold=cfg.reward.success_threshold,
        )
        for arm in ("graft", "all")
    }


def _targets(
    r: str,
    ex: dict[str, ExchangeResult],
    groups: dict[str, list[RolloutGroup]],
    pool,
    unseen: int,
    rng: random.Random,
    threshold: float,
) -> list[tuple[Prompt, str, dict]]:
    """The prompts measured for receiver ``r``: (prompt, kind, the row's exchange fields) for each prompt the
    graft arm selected (``replaced``) and up to ``unseen`` unseen ones of its family (``unseen``); admitted correct:
    a source reward above ``threshold``."""
    audits = {arm: [a for a in e.audit if a["receiver"] == r] for arm, e in ex.items()}
    targets = []  # (direction, prompt, kind, admitted per arm, admitted correct per arm, k_source)
    for a in audits["graft"]:
        d = f"{a['source']}->{r}"
        other = next(x for x in audits["all"] if x["source"] == a["source"])
        for pid in a["selected"]:
            g = next(g for g in groups[r] if g.prompt_id == pid)
            counts = {
                arm: [x for x in au["responses"] if x["prompt_id"] == pid and x["admitted"]]
                for arm, au in (("graft", a), ("all", other))
            }
            k_src = next(c["k_source"] for c in a["candidates"] if c["prompt_id"] == pid)
            base = dict(
                direction=d,
                admitted={k: len(v) for k, v in counts.items()},
                admitted_correct={k: sum(succeeded(x["reward_source"], threshold) for x in v) for k, v in counts.items()},
                k_source=k_src,
            )
            targets.append((Prompt(pid, g.problem, g.answer, g.messages), "replaced", base))
            fam = pool.get(family_of(pid), [])
            for q in rng.sample(fam, min(unseen, len(fam))):
                targets.append((q, "unseen", {**base, "replaced_by": pid}))
    return targets


def _arm_success(
    run,
    r: str,
    groups: dict[str, list[RolloutGroup]],
    ex: dict[str, ExchangeResult],
    prompts: list[Prompt],
    samples: int,
    step: int,
) -> dict[str, list[float]]:
    """Receiver ``r``'s success rates on ``prompts`` after each arm's update from the same state; ``r`` keeps
    the grpo arm's update (and its snapshot is freed before the next receiver's is taken)."""
    snap = _snapshot(run.learners[r])
    success = {}
    for arm in ("graft", "all", "grpo"):  # grpo last: the trajectory keeps it
        _restore(run.learners[r], snap)
        if arm == "grpo":
            loop.update_model(run, r, groups[r], step)
        else:  # R's own groups as in grpo (the all-fail ones too), plus the peer groups
            update_adding_peers(run, r, groups[r], [g for g in ex[arm].train_groups[r] if g.is_peer], step)
        success[arm] = success_rates(run, run.learners[r], prompts, samples, step)
    return success


def run_seed(cfg, at: list[int], samples: int, unseen: int, record, log) -> None:
    """One GRPO trajectory up to the last measured step; ``record(step, rows)`` as each state is measured."""
    run = loop.setup(cfg)
    try:
        if any(lr.workers.size != 1 for lr in run.learners.values()):
            raise ConfigError("graft onestep runs with backend: local (one rank per model)")
        pool = unseen_pool(cfg, run.sampler.prompts)
        for step in range(1, max(at) + 1):
            t0 = time.perf_counter()
            prompts, _ = run.sampler.next_batch()
            groups, _ = loop.rollout_phase(run, prompts, step)
            metrics = {"step": step} | loop.score_phase(run, groups)
            if step in at:
                new = [{"seed": cfg.seed, **x} for x in measure_state(run, groups, step, pool, samples, unseen)]
                record(step, new)
                log(
                    f"seed {cfg.seed} step {step}: measured {len(new)} prompts "
                    f"({sum(x['kind'] == 'replaced' for x in new)} replaced) in {time.perf_counter() - t0:.0f} s"
                )
            else:
                loop.update_phase(run, groups, step)
                log(f"seed {cfg.seed} step {step}: GRPO step in {time.perf_counter() - t0:.0f} s")
            run.metrics.write(metrics)
    finally:
        loop.close_run(run)


def checkpoint_states(run_dir: Path, at: list[int]) -> dict[int, Path | None]:
    """The checkpoint each measured step starts from: step s needs the run's checkpoint of step s - 1
    (s = 1 starts from the base weights: None)."""
    have = {checkpoint_step(p): p for p in list_checkpoints(run_dir)}
    missing = [s for s in at if s > 1 and s - 1 not in have]
    if missing:
        raise ConfigError(
            f"--from {run_dir}: measuring step(s) {missing} needs its checkpoint(s) of step(s) "
            f"{[s - 1 for s in missing]}; it has {sorted(have) or 'none'} (a run keeps them with "
            "checkpoint.save_every and checkpoint.keep_last)"
        )
    return {s: have.get(s - 1) for s in at}


def _link_tree(src: Path, dst: Path) -> None:
    """``dst`` mirrors ``src`` with hard links (a copy where the file system has none): no disk spent."""
    for root, _, files in os.walk(src):
        target = dst / Path(root).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for f in files:
            try:
                os.link(Path(root) / f, target / f)
            except OSError:
                shutil.copy2(Path(root) / f, target / f)


def _link_tree_file(src: Path, dst: Path) -> None:
    """``dst`` a hard link to the file ``src`` (a copy where the file system has none)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def from_run_config(run_dir: Path, overrides: list[str]):
    """A finished GRPO run's config (its ``config.yaml`` plus ``overrides``); refused when the run exchanged."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"--from {run_dir}: no config.yaml (not a graft run folder)")
    cfg = load_config(path, overrides)
    if exchange_kind(cfg) != "none":
        raise ConfigError(
            f"--from {run_dir}: the run exchanged ({exchange_kind(cfg)}); onestep measures along a GRPO "
            "trajectory (exchange.mode=grpo)"
        )
    return cfg


def measure_from_run(
    run_dir: Path, overrides: list[str], out: Path, at: list[int], samples: int, unseen: int, record, log
) -> None:
    """``at``'s states of a finished GRPO run, each resumed from its checkpoint of the step before in a
    scratch folder of hard links (removed afterwards); ``record(step, rows)`` as each state is measured."""
    cfg0 = from_run_config(run_dir, overrides)
    for step, ckpt in checkpoint_states(run_dir, at).items():
        t0 = time.perf_counter()
        scratch = out / f"seed{cfg0.seed}" / f"from-step{step}"
        shutil.rmtree(scratch, ignore_errors=True)
        if ckpt is not None:
            _link_tree(ckpt, scratch / "checkpoints" / ckpt.name)
            for name in ("metrics.jsonl", "audit.jsonl", "trajectories"):  # the history a resume checks is there
                if (run_dir / name).is_dir():
                    _link_tree(run_dir / name, scratch / name)
                elif (run_dir / name).is_file():
                    _link_tree_file(run_dir / name, scratch / name)
        cfg = load_config(
            run_dir / "config.yaml",
            [
                *overrides,
                f"run_dir={scratch}",
                f"resume={ckpt is not None}".lower(),
                "checkpoint.save_every=0",
                "checkpoint.save_final=false",
            ],
        )
        run = loop.setup(cfg)
        try:
            assert run.start_step == step, (run.start_step, step)
            prompts, _ = run.sampler.next_batch()
            groups, _ = loop.rollout_phase(run, prompts, step)
            loop.score_phase(run, groups)
            new = [
                {"seed": cfg.seed, **x}
                for x in measure_state(run, groups, step, unseen_pool(cfg, run.sampler.prompts), samples, unseen)
            ]
        finally:
            loop.close_run(run)
        shutil.rmtree(scratch, ignore_errors=True)
        with contextlib.suppress(OSError):  # the seed's folder, when nothing else is in it
            scratch.parent.rmdir()
        record(step, new)
        log(
            f"{run_dir} step {step}: measured {len(new)} prompts ({sum(x['kind'] == 'replaced' for x in new)} replaced) "
            f"in {time.perf_counter() - t0:.0f} s"
        )


def _read_rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def measured_states(out: Path) -> dict[int, set[int]]:
    """The (seed -> steps) already measured into ``out`` (``measured.json``): each is skipped when run again."""
    path = out / "measured.json"
    return {int(k): set(v) for k, v in json.loads(path.read_text()).items()} if path.exists() else {}


@contextlib.contextmanager
def out_lock(out: Path):
    """Hold ``out``'s lock file while reading and rewriting its records, so that commands measuring different
    states into the same ``--out`` at the same time (one per core) do not drop each other's rows."""
    with (out / ".lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def record_state(out: Path, seed: int, step: int, new: list[dict]) -> None:
    """Store one measured state: its rows replace any earlier rows of (seed, step) in ``rows.jsonl`` (kept in
    (seed, step) order), then ``measured.json`` lists it -- a state whose rows were written but not listed
    (killed in between) is measured again and its rows replaced. Call it under :func:`out_lock`."""
    rows = [r for r in _read_rows(out / "rows.jsonl") if (r["seed"], r["step"]) != (seed, step)] + new
    rows.sort(key=lambda r: (r["seed"], r["step"]))
    _write_atomic(out / "rows.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    done = measured_states(out)
    done.setdefault(seed, set()).add(step)
    _write_atomic(out / "measured.json", json.dumps({str(k): sorted(v) for k, v in sorted(done.items())}) + "\n")


def read_commands(out: Path) -> list[dict]:
    """``commands.jsonl``: per invocation that recorded a state, ``{"invocation", "command", "states": [[seed, step],
    ...]}`` in the order they first recorded one. A folder from before the log (no ``commands.jsonl``) gives its
    ``summary.json``'s ``commands``, with ``states`` None (not known)."""
    path = out / "commands.jsonl"
    if not path.exists():
        old = json.loads((out / "summary.json").read_text()).get("commands", []) if (out / "summary.json").exists() else []
        return [{"invocation": f"before-log-{i}", "command": c, "states": None} for i, c in enumerate(old)]
    by: dict[str, dict] = {}
    for e in read_jsonl(path):  # a line torn by a kill mid-append is skipped
        rec = by.setdefault(e["invocation"], {"invocation": e["invocation"], "command": e["command"], "states": []})
        if e.get("state") is None:
            rec["states"] = None
        elif rec["states"] is not None:
            rec["states"].append(e["state"])
    return list(by.values())


def log_command(out: Path, invocation: str, command: list[str], seed: int, step: int) -> None:
    """Append (invocation, command, state) to ``commands.jsonl`` as the state is recorded; the first line written
    into a folder from before the log carries over its ``summary.json``'s commands."""
    path = out / "commands.jsonl"
    if not path.exists():
        head = [{"invocation": e["invocation"], "command": e["command"], "state": None} for e in read_commands(out)]
        _write_atomic(path, "".join(json.dumps(e) + "\n" for e in head))
    torn = not path.read_bytes().endswith(b"\n") and path.stat().st_size > 0
    with path.open("a") as f:  # after a torn last line, start a fresh one so this record stays readable
        f.write(("\n" if torn else "") + json.dumps({"invocation": invocation, "command": command, "state": [seed, step]}) + "\n")


def _check_arms_version(out: Path, measuring: bool) -> None:
    """Refuse to add states to a folder whose rows were measured with other arms (:data:`ARMS_VERSION`)."""
    old = sorted({r.get("arms_version", 1) for r in _read_rows(out / "rows.jsonl")} - {ARMS_VERSION})
    if measuring and old:
        raise ConfigError(
            f"--out {out} holds states measured with arms version {old} (this graft measures version "
            f"{ARMS_VERSION}: GRPO's update plus the peer groups); measure into a new folder"
        )


def _parse(argv: list[str]) -> argparse.Namespace:
    args = onestep_parser().parse_intermixed_args(argv)
    if min(args.at) < 1 or args.unseen < 0:
        raise ConfigError("--at steps must be >= 1, --unseen >= 0")
    if args.samples < MIN_SAMPLES:
        raise ConfigError(f"--samples {args.samples}: the one-update test samples every prompt >= {MIN_SAMPLES} times per arm")
    if args.from_runs is not None:  # the run's own config.yaml: every positional argument is an override
        args.overrides = [x for x in [args.config, *args.overrides] if x is not None]
        args.config = None
        bad = [x for x in args.overrides if "=" not in x]
        if bad:
            raise ConfigError(f"with --from the config is each run's config.yaml; {bad[0]!r} is not a key=value override")
    elif args.config is None:
        raise ConfigError("graft onestep needs a config (whose GRPO trajectories it trains) or --from RUN_DIR ...")
    return args


def _check_pair_task(cfg) -> None:
    require_families(cfg, "graft onestep (unseen prompts are drawn per family)")
    if len(cfg.models) != 2:
        raise ConfigError(f"graft onestep measures a pair; the config has {len(cfg.models)} models")
    kl = [m.name for m in cfg.models if m.kl_coef > 0]
    if kl or cfg.exchange.pooled_rewards:
        raise ConfigError(
            "graft onestep's arms differ by the peer groups only, which "
            + (
                f"a KL penalty (kl_coef > 0: {', '.join(kl)}) does not allow"
                if kl
                else "exchange.pooled_rewards (it changes the receiver's own advantages) does not allow"
            )
        )


def _units(args, out: Path) -> list[tuple[int, object]]:
    """(seed, how to measure it) per trajectory: a config to train along, or a finished run's folder."""
    at = sorted(set(args.at))
    units: list[tuple[int, object]] = []
    if args.from_runs is not None:
        for run_dir in map(Path, args.from_runs):
            cfg = from_run_config(run_dir, args.overrides)
            _check_pair_task(cfg)
            checkpoint_states(run_dir, at)  # every needed checkpoint is there before anything runs
            units.append((cfg.seed, run_dir))
        seeds = [s for s, _ in units]
        if len(set(seeds)) != len(seeds):
            raise ConfigError(f"--from: two runs share a seed ({seeds}); rows are keyed by seed")
        return units
    for seed in args.seeds:
        cfg = load_config(
            args.config,
            [
                *args.overrides,
                f"seed={seed}",
                f"run_dir={out / f'seed{seed}'}",
                "resume=false",
                "checkpoint.save_every=0",
                "checkpoint.save_final=false",
            ],
        )
        _check_pair_task(cfg)
        units.append((seed, cfg))
    return units


def onestep_main(argv: list[str]) -> int:
    args = _parse(argv)
    out = Path(args.out)
    at = sorted(set(args.at))
    units = _units(args, out)
    out.mkdir(parents=True, exist_ok=True)
    log = lambda s: say(f"[onestep] {s}")  # noqa: E731
    command = ["graft", "onestep", *argv]
    invocation = f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime())}/{os.getpid()}"

    def record(step: int, new: list[dict], seed: int) -> None:
        with out_lock(out):
            record_state(out, seed, step, new)
            log_command(out, invocation, command, seed, step)

    _check_arms_version(out, any(set(at) - measured_states(out).get(seed, set()) for seed, _ in units))
    for seed, how in units:
        todo = [s for s in at if s not in measured_states(out).get(seed, set())]
        if not todo:
            log(f"seed {seed}: steps {at} measured, skipped")
            continue
        record_seed = lambda step, new, seed=seed: record(step, new, seed)  # noqa: E731
        if isinstance(how, Path):
            measure_from_run(how, args.overrides, out, todo, args.samples, args.unseen, record_seed, log)
        else:
            shutil.rmtree(out / f"seed{seed}", ignore_errors=True)
            run_seed(how, todo, args.samples, args.unseen, record_seed, log)
    with out_lock(out):
        rows = _read_rows(out / "rows.jsonl")
        invocations = read_commands(out)
        measured = sum(len(v) for v in measured_states(out).values())
    summary = {
        "command": command,
        "commands": [e["command"] for e in invocations],
        "invocations": invocations,
        **summarize_rows(rows),
        "states": {
            "measured": measured,
            "with_exchange": len({(r["seed"], r["step"]) for r in rows}),
        },
    }
    _write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    for d, kinds in summary["graft_minus_grpo"].items():
        for kind, s in kinds.items():
            if s["mean"] is not None:
                t = s["t95"]
                t_ci = "none (one state)" if t["ci95"][0] is None else f"[{100 * t['ci95'][0]:+.2f}, {100 * t['ci95'][1]:+.2f}]"
                log(
                    f"{d} {kind}: graft - grpo {100 * s['mean']:+.2f} points over {s['prompts']} prompts "
                    f"({s['differed']} changed), {s['states']} states; mean of state means {100 * t['mean']:+.2f}, "
                    f"t 95 % CI {t_ci} (the verdict's); cluster bootstrap [{100 * s['ci95'][0]:+.2f}, "
                    f"{100 * s['ci95'][1]:+.2f}]"
                )
    print(out / "summary.json")
    return 0
