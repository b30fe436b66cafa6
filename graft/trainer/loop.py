"""The GRAFT training loop: ``rollout -> score -> exchange -> update`` for every model, every step.

Departures from the paper's verl recipe, all deliberate and documented in the README:
sampler log-probs serve as pi_theta_old for own tokens (``update.recompute_old_logprobs``
switches to a forward pass right after sampling; required by the bf16 sampler ``rollout.engine=hf-bf16``);
zero-advantage sequences are not forwarded in the update
(their loss and gradient are exactly zero; their tokens still count in token-mean).
"""

from __future__ import annotations

import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import torch
from tqdm.auto import tqdm

from graft import cores
from graft.algos.advantages import grpo_advantages
from graft.algos.minibatch import plan_minibatches
from graft.config import Config, ConfigError, save_config, to_dict
from graft.console import bars, say
from graft.data.datasets import DataError, PromptSampler, check_batch_fits, prompts_fingerprint, source_name
from graft.data.tasks import family_of, task_families
from graft.domains import Domain
from graft.domains.grading import grading_note, load_data, make_grader, reward_code, task_domain, unrewardable
from graft.errors import UserError
from graft.evaluation.evaluate import best_checkpoint, evaluate_during_training
from graft.exchange.common import adv_norm, complementarity, counts
from graft.exchange.kinds import Exchange, describe_exchange, make_exchange, open_peer_store
from graft.files import dumps_json, write_text, writing
from graft.policy.context import check_learner_context
from graft.policy.loading import ModelLoadError, check_model_source, quiet_loading
from graft.policy.prompts import check_conversations
from graft.reward.grader import Grader
from graft.seeds import round_seed, step_seed
from graft.signals import StopSignal
from graft.storage.checkpoint import (
    checkpoint_step,
    latest_checkpoint,
    list_checkpoints,
    remove_checkpoints_after,
    save_checkpoint,
    set_rng_state,
)
from graft.storage.lock import FolderLock
from graft.storage.trajectory_store import TrajectoryStore
from graft.trainer.backends import close_learners, make_learners, worker_memory
from graft.trainer.dynamic import Round, fill_batches
from graft.trainer.learner import Learner
from graft.trainer.metrics import (
    JsonlWriter,
    TokenCounter,
    check_run_dir,
    completion_rows,
    console_line,
    group_stats,
    in_group_reward_stats,
    prefixed,
    success_warnings,
    timed,
    trl_aliases,
)
from graft.trainer.resume import CHANGES, Start, describe_changes, history, record_changes, start_of
from graft.trainer.rules import UpdateRule, make_rule
from graft.trainer.stop import Diverged, Preempted, StopTraining
from graft.trainer.tracking import check_trackers, open_trackers
from graft.trainer.workers import process_memory
from graft.types import VERIFY_TIMEOUT, DirectionAudit, ExchangeResult, Prompt, RolloutGroup

T = TypeVar("T")


class GraderHang(UserError, RuntimeError):
    """Most verifications of a step timed out."""


@dataclass
class Run:
    """Everything a step needs; built once by :func:`setup`."""

    cfg: Config
    run_dir: Path
    learners: dict[str, Learner]
    sampler: PromptSampler
    grader: Grader
    """Grades responses (:func:`graft.domains.grading.make_grader`: the domain's verifier or the user's functions)."""
    metrics: JsonlWriter
    audit: JsonlWriter
    store: TrajectoryStore
    rule: UpdateRule
    """The update rule (``update.rule``), with its state."""
    lock: FolderLock
    """The run folder's lock, held until :func:`train` ends."""
    domain: Domain
    """The task domain (``reward.domain``): its reward monitor runs on every step's rewarded responses."""
    exchange: Exchange = field(init=False)
    """Which groups each model trains on (:func:`graft.exchange.kinds.make_exchange`), with its state. Set by
    :func:`setup` right after the Run is built (the exchange re-verifies with :meth:`grade`, a method of the Run)."""
    start_step: int = 1
    val_prompts: list[Prompt] | None = None
    eval_history: list[dict] = field(default_factory=list)
    by_family: bool = False
    """The prompts are a mixture of problem families (``FAMILY-00017`` ids): rewards are also logged per family."""
    nonfinite_streak: dict[str, int] = field(default_factory=dict)
    """Per model: consecutive steps with an update skipped for a non-finite loss or gradient norm."""
    completions: dict = field(default_factory=dict)
    """The last step's sample of completions for the trackers (model -> :func:`completion_rows` rows)."""
    start: Start | None = None
    """How the run started (:func:`graft.trainer.resume.start_of`): its reward code and learning-rate horizons, saved
    with every checkpoint, and what a resume changed."""
    tokens: TokenCounter = field(default_factory=TokenCounter)
    """Per model: the prompt + completion tokens sampled so far (``M/num_tokens``)."""

    @property
    def bars(self) -> bool:
        return progress_bars(self.cfg)

    def grade(self, groups: list[RolloutGroup]) -> None:
        grade(self, groups)


def progress_bars(cfg: Config) -> bool:
    """Progress bars are drawn only with ``progress: true`` and stderr a terminal; a log file or CI gets
    the one line per step (:func:`~graft.trainer.metrics.console_line`) and nothing else."""
    return bars(cfg.progress)


# ============================================================================ phases


def per_model(run: Run, phase: str, fn: Callable[[str], T]) -> dict[str, T]:
    """``{name: fn(name)}`` for every model, in the models' order. Without ``threads_per_model[phase]``: one model
    after the other on this thread (each using ``threads``). With it: side by side, one Python thread per model,
    each running its torch intra-op work on ``threads_per_model[phase]`` threads of its own (OpenMP's thread count
    is per calling thread; every model samples from its own generators, so what each computes is what it computes
    alone with that many threads). ``threads_claim_freed``: a model that finishes hands its threads to the ones
    still running (:mod:`graft.cores`; they take them at their next :func:`graft.cores.poll`). ``backend: ray``:
    every model's worker calls are in flight before any is awaited. The first model's exception (in the models'
    order) is raised after all have finished."""
    k = run.cfg.threads_per_model.get(phase)
    names = list(run.learners)
    if not k or len(names) < 2:
        return {n: fn(n) for n in names}
    share = cores.Share(names, k) if run.cfg.threads_claim_freed else None

    def task(name: str) -> T:
        if share is not None:
            with cores.claiming(share, name):
                return fn(name)
        torch.set_num_threads(k)  # this Python thread's OpenMP team only
        return fn(name)

    with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix=f"graft-{phase}") as pool:
        futures = {n: pool.submit(task, n) for n in names}
        wait(list(futures.values()))
    return {n: futures[n].result() for n in names}


def rollout_phase(run: Run, prompts, step: int, sampling_round: int = 0) -> tuple[dict[str, list[RolloutGroup]], dict]:
    """G samples per prompt from every model (side by side with ``threads_per_model.rollout``: :func:`per_model`);
    with ``update.recompute_old_logprobs`` their behaviour log-probs then come from a forward pass (before the
    exchange, so ``s`` uses them too). Each sampling round of a step has its own seeds (:func:`round_seed`)."""
    cfg = run.cfg

    def one(name: str) -> tuple[list[RolloutGroup], dict]:
        learner = run.learners[name]
        gs, m = learner.rollout(prompts, cfg.rollout, step, round_seed(cfg.seed, step, sampling_round, name), run.bars)
        if cfg.update.recompute_old_logprobs:
            m |= learner.recompute_old_logprobs(gs, cfg.update, cfg.rollout.temperature)
        return gs, m

    done = per_model(run, "rollout", one)
    metrics: dict = {}
    for name, (_, m) in done.items():
        metrics |= prefixed(name, m)
    return {name: gs for name, (gs, _) in done.items()}, metrics


def grade(run: Run, groups: list[RolloutGroup]) -> None:
    """Fill rewards and verifier status of ``groups`` in place."""
    texts = [r for g in groups for r in g.responses]
    answers = [g.answer for g in groups for _ in g.responses]
    ids = [t for g in groups for t in g.token_ids]  # the holder's tokens: a reward function's completion_ids
    progress = run.bars and len(texts) > 256
    rewards, statuses, parts = run.grader.grade_parts(texts, answers, progress=progress, completion_ids=ids)
    timeouts = statuses.count(VERIFY_TIMEOUT)
    if texts and timeouts / len(texts) > run.cfg.reward.max_timeout_frac:
        raise GraderHang(
            f"{timeouts} of {len(texts)} verifications exceeded reward.timeout_s={run.cfg.reward.timeout_s}s; "
            "the grader appears to hang (raise reward.timeout_s or reward.max_timeout_frac if answers are "
            "legitimately slow to verify)"
        )
    i = 0
    for g in groups:
        g.rewards, g.status = rewards[i : i + g.size], statuses[i : i + g.size]
        g.reward_parts = {name: values[i : i + g.size] for name, values in parts.items()}
        i += g.size


def score(run: Run, groups: dict[str, list[RolloutGroup]]) -> None:
    """Verify every response and compute GRPO advantages per group, in place."""
    grade(run, [g for gs in groups.values() for g in gs])
    for gs in groups.values():
        adv = grpo_advantages(torch.stack([g.rewards_tensor() for g in gs]), *adv_norm(run.cfg.update))
        for g, a in zip(gs, adv, strict=True):  # adv: a row per group
            g.advantages = a.tolist()


def score_phase(run: Run, groups: dict[str, list[RolloutGroup]]) -> dict:
    """Verify every response and compute GRPO advantages per group (:func:`score`); their metrics."""
    score(run, groups)
    metrics: dict = {}
    threshold = run.cfg.reward.success_threshold
    for name, gs in groups.items():
        st = group_stats(gs, threshold) | in_group_reward_stats([g.rewards for g in gs])
        metrics |= prefixed(name, st | trl_aliases(st) | reward_monitor(run.domain, gs, run.by_family, threshold))
    k = {n: counts(gs, threshold) for n, gs in groups.items()}
    for s in k:
        for r in k:
            if s != r:
                metrics[f"complementarity/{s}->{r}"] = complementarity(k[s], k[r])
    return metrics


def reward_monitor(domain: Domain, groups: list[RolloutGroup], by_family: bool, threshold: float) -> dict:
    """What the rewarded answers (above ``threshold``) look like (the domain's monitor, :meth:`Domain.monitor`):
    ``rewarded/FLAG`` shares; ``distinct_frac``, the mean share of distinct response texts in a group (1 = all G
    differ, 1/G = one answer repeated: a policy collapsing onto one text); with ``by_family`` the mean reward of each
    problem family in the batch (``reward/family/F``)."""
    texts = [r for g in groups for r in g.responses]
    problems = [g.problem for g in groups for _ in g.responses]
    references = [g.answer for g in groups for _ in g.responses]
    rewards = [x for g in groups for x in g.rewards]
    statuses = [s for g in groups for s in g.status]
    out = prefixed("rewarded", domain.monitor(texts, problems, references, rewards, threshold, statuses))
    out["distinct_frac"] = sum(len(set(g.responses)) / g.size for g in groups) / max(len(groups), 1)
    if by_family:
        fams: dict[str, list[float]] = {}
        for g in groups:
            fams.setdefault(family_of(g.prompt_id), []).extend(g.rewards)
        out |= {f"reward/family/{f}": sum(v) / len(v) for f, v in sorted(fams.items())}
    return out


def exchange_phase(run: Run, groups: dict[str, list[RolloutGroup]], step: int, sampling_round: int = 0) -> ExchangeResult:
    """Who trains on what (``run.exchange``: GRAFT among the live models, a stored peer, HACPO's sharing or none), in
    the step's sampling round ``sampling_round`` (its random stream)."""
    run.exchange.sampling_round = sampling_round
    return run.exchange(groups, step)


def more_rounds(run: Run, step: int, first: Round) -> tuple[dict[str, list[RolloutGroup]], ExchangeResult, dict]:
    """Dynamic sampling (:func:`graft.trainer.dynamic.fill_batches`): after round ``first``, rounds on the sampler's
    next batches until every model keeps ``batch_prompts`` prompts that carry gradient or ``rollout.max_rounds`` ran."""
    return fill_batches(
        first,
        lambda: run.sampler.next_batch()[0],
        lambda prompts, r: sample_round(run, prompts, step, r),
        run.cfg.batch_prompts,
        run.cfg.rollout.max_rounds,
    )


def sample_round(run: Run, prompts: list[Prompt], step: int, sampling_round: int) -> Round:
    """A further sampling round of the step (``rollout.dynamic_sampling``): rollout, score and exchange on
    ``prompts``, with the round's own seeds."""
    groups, m = rollout_phase(run, prompts, step, sampling_round)
    score(run, groups)
    return Round(prompts, groups, exchange_phase(run, groups, step, sampling_round), m)


def update_model(run: Run, name: str, groups: list[RolloutGroup], step: int) -> dict:
    """One model's update on ``groups``: minibatches planned from the step's own seed, ``update.epochs`` passes,
    at the step's learning rate (``models.I.lr_schedule`` over the horizon the run recorded)."""
    cfg = run.cfg
    lr = set_learning_rate(run, name, step)
    if not groups:  # dynamic sampling kept none
        say(f"warning: step {step}: model {name}: no group carries gradient after {cfg.rollout.max_rounds} rounds; no update")
        return {"learning_rate": lr, "update/skipped_empty": 1}
    gen = torch.Generator().manual_seed(step_seed(cfg.seed, step, f"plan/{name}"))
    gs = run.rule.prepare(groups)
    plan = plan_minibatches([g.is_peer for g in gs], cfg.update.num_minibatches, cfg.update.order, gen)
    m, skipped = {}, 0
    for _ in range(cfg.update.epochs):
        m = run.learners[name].update(gs, plan, cfg.update, cfg.rollout.temperature, run.rule, progress=run.bars)
        skipped += m["update/skipped_nonfinite"]
    m["update/skipped_nonfinite"] = skipped
    m["learning_rate"] = lr
    if skipped:
        say(
            f"warning: step {step}: model {name}: loss or gradient norm not finite (loss {m['loss']}, grad norm "
            f"{m['grad_norm']}); {skipped} of {len(plan) * cfg.update.epochs} optimizer steps skipped"
        )
    m["peer_groups"] = sum(g.is_peer for g in gs)
    m["peer_responses"] = sum(g.size for g in gs if g.is_peer)
    m["peer_row_share"] = m["peer_responses"] / max(1, sum(g.size for g in gs))
    return m


def set_learning_rate(run: Run, name: str, step: int) -> float:
    """Model ``name``'s learning rate at ``step``: its schedule over the horizon the run recorded at its start
    (:attr:`Run.start`); returns it."""
    assert run.start is not None, "setup() records how the run started"
    return run.learners[name].set_learning_rate(step, run.start.lr_horizon[name])


def update_phase(run: Run, train_groups: dict[str, list[RolloutGroup]], step: int) -> dict:
    """Every model's update (side by side with ``threads_per_model.update``: :func:`per_model`)."""
    metrics: dict = {}
    for name, m in per_model(run, "update", lambda name: update_model(run, name, train_groups[name], step)).items():
        metrics |= prefixed(name, m | trl_aliases(m))
    return metrics


# ============================================================================ step and run


def train_step(run: Run, step: int) -> dict:
    """One step; returns its metrics (and leaves a sample of its completions in ``run.completions``)."""
    metrics: dict = {"step": step}
    t0 = time.perf_counter()
    prompts, epoch = run.sampler.next_batch()
    metrics["epoch"] = epoch
    with timed(metrics, "rollout"):
        groups, m = rollout_phase(run, prompts, step)
    metrics |= m | run.tokens.add(groups)
    with timed(metrics, "score"):
        metrics |= score_phase(run, groups)
    if step == 1:
        for line in success_warnings(groups, run.cfg.reward.success_threshold):
            say(line)
    with timed(metrics, "exchange"):
        ex = exchange_phase(run, groups, step)
    if run.cfg.rollout.dynamic_sampling:  # rewards and rollout metrics stay round 0's
        with timed(metrics, "dynamic"):
            groups, ex, dyn = more_rounds(run, step, Round(prompts, groups, ex, m))
        metrics |= dyn
    metrics |= ex.metrics
    with timed(metrics, "update"):
        metrics |= update_phase(run, ex.train_groups, step)
    metrics["time/step_s"] = time.perf_counter() - t0
    metrics |= prefixed("mem", process_memory())  # the driver process (and its GPU, once used)
    run.store.write_step(step, epoch, [g for gs in groups.values() for g in gs], _tokenizer_names(run), _peer_use(ex.audit))
    for rec in ex.audit:
        run.audit.write(rec)
    run.completions = completion_rows(step, groups, run.cfg.logging.log_completions if run.cfg.logging.report_to else 0)
    return metrics


def _tokenizer_names(run: Run) -> dict[str, str]:
    return {n: learner.cfg.tokenizer or learner.cfg.path for n, learner in run.learners.items()}


def _peer_use(audit: list[DirectionAudit]) -> dict:
    use: dict = {}
    for rec in audit:
        for row in rec["responses"]:
            use.setdefault((rec["source"], row["prompt_id"], row["index"]), []).append(
                (rec["receiver"], row["admitted"], row["weight"])
            )
    return use


def setup(cfg: Config) -> Run:
    """Validate inputs, load data and models (or a checkpoint), open the output files."""
    run_dir = Path(cfg.run_dir)
    check_trackers(cfg.logging)  # a tracker's package is missing, W&B's host unreachable: said before anything loads
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    prompts, stats = _load_data("data.train", cfg.data.train, cfg)
    if stats.get("skipped"):
        say(f"data: skipped {stats['skipped']} bad rows: {stats.get('skipped_reasons')}")
    if (warning := unrewardable(cfg.reward, prompts, "data.train")) is not None:
        say(warning)
    check_batch_fits(prompts, cfg.batch_prompts, cfg.data.train)
    grading_note(cfg.reward)  # a domain that cannot grade safely here (code without its sandbox) stops before models load
    val = _load_data("data.val", cfg.data.val, cfg, cfg.data.val_limit)[0] if cfg.data.val else None
    check_run_dir(run_dir)  # before anything is loaded or written
    lock = FolderLock(run_dir, "run_dir").acquire()  # a second process on this run stops here, having written nothing
    try:
        return _setup_locked(cfg, run_dir, prompts, val, lock)
    except BaseException:
        lock.release()
        raise


def _setup_locked(cfg: Config, run_dir: Path, prompts, val, lock: FolderLock) -> Run:
    start = start_of(cfg, run_dir, reward_code(cfg.reward))  # a missing reward module, changed code: said before models load
    ckpt = start.ckpt
    sampler = _sampler(cfg, prompts, ckpt)  # resuming on other training data fails here
    _check_model_sources(cfg, ckpt)
    peer = open_peer_store(cfg)  # a stored peer's groups, read before any model loads
    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    if not progress_bars(cfg):
        quiet_loading()  # no download / weight-loading bars of the hub and transformers either
    learners = make_learners(cfg, device, ckpt, progress_bars(cfg))  # one Learner per model, local or in Ray
    try:
        _check_contexts(cfg, learners, prompts, val)
    except ConfigError:
        close_learners(learners)
        raise
    run_dir.mkdir(parents=True, exist_ok=True)
    note = grading_note(cfg.reward)  # how the run grades (code: its sandbox), stated beside the exchange
    save_config(cfg, run_dir / "config.yaml", describe_exchange(cfg).lines() + ([f"grading: {note}"] if note else []))
    run = Run(
        cfg=cfg,
        run_dir=run_dir,
        learners=learners,
        sampler=sampler,
        grader=make_grader(cfg.reward),
        domain=task_domain(cfg.reward),
        metrics=JsonlWriter(run_dir / "metrics.jsonl"),
        audit=JsonlWriter(run_dir / "audit.jsonl"),
        store=TrajectoryStore(run_dir / "trajectories", run_id=run_dir.name),
        val_prompts=val,
        rule=make_rule(cfg.update, cfg.reward.success_threshold),
        lock=lock,
        by_family=task_families(cfg) is not None,
        start=start,
    )
    run.exchange = make_exchange(cfg, learners, run.grade, peer)
    _restore(run, ckpt)
    return run


def _check_contexts(cfg: Config, learners: dict[str, Learner], prompts, val) -> None:
    """Every model holds its longest training (and validation) prompt plus the tokens it may generate."""
    for learner in learners.values():
        check_learner_context(learner, prompts, cfg.rollout.max_new_tokens)
        if val and cfg.eval.every:
            field = "eval.max_new_tokens" if cfg.eval.max_new_tokens else "rollout.max_new_tokens"
            check_learner_context(learner, val, cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens, field)


def _load_data(key: str, spec: Any, cfg: Config, limit: int | None = None):
    try:
        prompts, stats = load_data(spec, cfg, limit)
    except DataError as e:
        raise DataError(f"{key}: {e}") from None
    check_conversations(cfg.models, prompts, key)  # a conversation a model's template cannot render: before models load
    return prompts, stats


def _check_model_sources(cfg: Config, ckpt) -> None:
    """A missing model path or an unreachable hub fails here, before any model is loaded."""

    for i, m in enumerate(cfg.models):
        checks = [("path", m.path, "model")] if ckpt is None or m.lora.enabled else []  # resumed: weights from the checkpoint
        checks += [("tokenizer", m.tokenizer, "tokenizer")] if m.tokenizer else []
        for field_name, path, what in checks:
            try:
                check_model_source(path, m.revision, what=what)
            except ModelLoadError as e:
                raise ModelLoadError(f"models.{i}.{field_name}: {e}") from None


def _sampler(cfg: Config, prompts, ckpt) -> PromptSampler:
    """The prompt sampler, continued from ``ckpt``. Resuming on training data that differs from the
    data the checkpoint was trained on (ids, problems, answers or order: ``state["data_fingerprint"]``;
    for older checkpoints the sampler's own check of the ids) is a :class:`DataError`."""
    sampler = PromptSampler(prompts, cfg.batch_prompts, cfg.seed, cfg.data.shuffle)
    if ckpt is None:
        return sampler
    saved, now = ckpt.state.get("data_fingerprint"), prompts_fingerprint(prompts)
    if saved is not None and now["sha256"] != saved.get("sha256"):
        raise DataError(
            f"data.train ({source_name(cfg.data.train)}) changed since {ckpt.path} was saved: it held {saved.get('prompts')} "
            f"prompts (sha256 {str(saved.get('sha256'))[:12]}), now {now['prompts']} (sha256 {now['sha256'][:12]}); "
            "resume with the original data, or start a new run_dir"
        )
    try:
        sampler.load_state_dict(ckpt.state["sampler"])
    except ValueError as e:
        raise DataError(f"data.train: cannot resume from {ckpt.path} with data.train={cfg.data.train}: {e}") from None
    return sampler


def _restore(run: Run, ckpt) -> None:
    if ckpt is None:
        return
    for name, learner in run.learners.items():
        learner.optimizer.load_state_dict(ckpt.optimizer_state(name))
    run.rule.load_state_dict(ckpt.state.get("rule", {}))
    run.exchange.load_state_dict(ckpt.state.get("exchange", ckpt.state.get("rule", {})))  # HACPO's rates were the rule's
    run.eval_history = ckpt.state.get("eval_history", [])
    run.nonfinite_streak = dict(ckpt.state.get("nonfinite_streak", {}))
    run.start_step = ckpt.step + 1
    for w in (run.metrics, run.audit):
        w.truncate_after(ckpt.step)
    run.tokens.load_state_dict(ckpt.state.get("num_tokens"), run.metrics.read())
    run.store.truncate_after(ckpt.step)
    remove_checkpoints_after(run.run_dir, ckpt.step)  # a later timeline being abandoned
    set_rng_state(ckpt.rng)
    assert run.start is not None
    changed = describe_changes(run.start.changes)
    record_changes(run.run_dir, ckpt, run.start.changes)
    say(f"resumed from {ckpt.path} at step {ckpt.step}")
    if changed:
        say(f"changed since the checkpoint (recorded in {run.run_dir / CHANGES}): {changed}")


def save(run: Run, step: int) -> Path:
    for name, learner in run.learners.items():  # never a checkpoint of NaN/inf weights
        bad = learner.nonfinite_parameters()
        if bad:
            raise Diverged(
                f"step {step}: model {name}: {len(bad)} parameter tensor(s) hold NaN or inf ({', '.join(bad[:3])}"
                f"{', ...' if len(bad) > 3 else ''}); no checkpoint written, the last one is "
                f"{latest_checkpoint(run.run_dir) or 'none'}"
            )
    state = {
        "sampler": run.sampler.state_dict(),
        "step": step,
        "eval_history": run.eval_history,
        "rule": run.rule.state_dict(),
        "exchange": run.exchange.state_dict(),
        "data_fingerprint": prompts_fingerprint(run.sampler.prompts),
        "nonfinite_streak": run.nonfinite_streak,
        "num_tokens": run.tokens.state_dict(),
        "reward_code": run.start.reward_code if run.start else {},
        "lr_horizon": run.start.lr_horizon if run.start else {},
        "history": history(run.run_dir, step),
    }
    ck = run.cfg.checkpoint
    saved = {checkpoint_step(p) for p in list_checkpoints(run.run_dir)} | {step}
    keep = {s for s in saved if ck.keep_period and s % ck.keep_period == 0}
    if ck.keep_best and run.eval_history:  # the best-evaluated checkpoint of each model survives pruning
        keep |= {b for n in run.learners if (b := best_checkpoint(run.eval_history, f"eval/{n}/val/pass@1", saved)) is not None}
    with writing(run.run_dir / "checkpoints"):  # what no inner writer named: disk full, permissions
        return save_checkpoint(
            run.run_dir,
            step,
            {n: learner.save for n, learner in run.learners.items()},
            {n: learner.optimizer for n, learner in run.learners.items()},
            state,
            to_dict(run.cfg),
            ck.keep_last,
            keep_optimizer=ck.keep_optimizer,
            keep_steps=keep,
        )


def evaluate_phase(run: Run, step: int) -> dict:
    assert run.val_prompts is not None, "evaluated only with validation prompts (_train checks run.val_prompts)"
    out: dict = {}
    for name, learner in run.learners.items():
        # The same seed at every step: checkpoints are compared on the same random draws.
        res = evaluate_during_training(
            learner,
            {"val": run.val_prompts},
            run.grader,
            run.cfg.eval,
            max_new_tokens=run.cfg.eval.max_new_tokens or run.cfg.rollout.max_new_tokens,
            seed=step_seed(run.cfg.seed, 0, f"eval/{name}"),
            batch_size=run.cfg.rollout.batch_size,
            out_dir=run.run_dir / "eval" / f"step_{step:06d}" / name,
            model_label=str(learner.cfg.path),
            success_threshold=run.cfg.reward.success_threshold,
        )
        out |= prefixed(f"eval/{name}", res)
    run.eval_history.append({"step": step, **out})
    for name in run.learners:
        # Best checkpoint rule: highest validation pass@1, ties to the earlier step.
        out[f"eval/{name}/best_step"] = best_checkpoint(run.eval_history, f"eval/{name}/val/pass@1")
    return out


def close_run(run: Run) -> None:
    """Release all that :func:`setup` opened: the grader's workers, the learners (Ray actors, rollout engines),
    the trajectory store and the run folder's lock. :func:`train` does the same in two halves (the learners
    before its summary, the store and lock last)."""
    run.grader.close()
    close_learners(run.learners)
    run.store.close()
    run.lock.release()


Callback = Callable[[int, dict], Any]
"""``fn(step, metrics)`` after every step (``metrics``: the step's ``metrics.jsonl`` line, a copy); ``True`` or
:class:`StopTraining` ends the run after that step, checkpointed."""


def train(cfg: Config, callbacks: Sequence[Callback] = ()) -> dict:
    """Run (or resume) a whole training job; returns the end-of-run summary (``stopped_at``: the step a callback
    ended it after, else None). Raises :class:`Preempted` after a SIGTERM/SIGINT/SIGHUP (the finished steps
    checkpointed) and :class:`Diverged` when updates stay non-finite (``update.max_nonfinite_steps``)."""
    with StopSignal() as stop:
        run = setup(cfg)
        try:
            return _train(run, stop, list(callbacks))
        finally:
            run.store.close()
            run.lock.release()


def _train(run: Run, stop: StopSignal, callbacks: list[Callback]) -> dict:
    cfg, ck = run.cfg, run.cfg.checkpoint
    t_start, history, stopped_at = time.perf_counter(), [], None
    tracker = None
    try:
        tracker = open_trackers(run.run_dir, cfg, run.start_step)
        say("\n".join(run.exchange.describe().lines()))
        bar = tqdm(
            range(run.start_step, cfg.steps + 1), desc="steps", disable=not run.bars, initial=run.start_step - 1, total=cfg.steps
        )
        for step in bar:
            if stop.requested:  # arrived before the first step of this process (while loading)
                raise Preempted(f"{stop.requested}: stopped at step {step - 1}; continue with resume=true")
            m = train_step(run, step)
            m |= worker_memory(run.learners)  # backend ray: peak RSS of each model's workers
            if cfg.eval.every and run.val_prompts and step % cfg.eval.every == 0:
                m |= evaluate_phase(run, step)
            run.metrics.write(m)
            tracker.log(step, m, run.completions)
            history.append(m)
            say(console_line(step, cfg.steps, m, list(run.learners)))
            check_nonfinite_streak(run, step, m)
            saved = ck.save_every and step % ck.save_every == 0 and step < cfg.steps
            if saved:
                save(run, step)
            if stop.requested and step < cfg.steps:  # in the last step: the run simply finishes
                path = latest_checkpoint(run.run_dir) if saved else save(run, step)
                raise Preempted(f"{stop.requested}: stopped at step {step}; continue with resume=true (checkpoint {path})")
            if ask_callbacks(callbacks, step, m) and step < cfg.steps:
                path = latest_checkpoint(run.run_dir) if saved else save(run, step)
                say(f"a callback stopped the run after step {step}; continue it with resume=true (checkpoint {path})")
                stopped_at = step
                break
        done = stopped_at is None and cfg.steps >= run.start_step
        final = save(run, cfg.steps) if ck.save_final and done else None
    finally:
        if tracker is not None:
            tracker.close()
        run.grader.close()
        close_learners(run.learners)  # Ray actors / rollout engines; a WorkerFailure propagates after this
    summary = summarize(run, time.perf_counter() - t_start, final) | {"stopped_at": stopped_at}
    write_text(run.run_dir / "summary.json", dumps_json(summary, indent=2, default=str))
    print_summary(summary, file=sys.stderr)
    return summary


def ask_callbacks(callbacks: list[Callback], step: int, metrics: dict) -> bool:
    """Call every callback with the step's metrics (each its own copy); whether one asked to stop (returned
    ``True`` or raised :class:`StopTraining`). Every callback is called, also after one asked."""
    stop = False
    for fn in callbacks:
        try:
            stop = fn(step, dict(metrics)) is True or stop
        except StopTraining:
            stop = True
    return stop


def check_nonfinite_streak(run: Run, step: int, m: dict) -> None:
    """Count, per model, consecutive steps with a skipped non-finite update; raise :class:`Diverged`
    at ``update.max_nonfinite_steps`` (after the step's metrics are written; no checkpoint is taken)."""
    limit = run.cfg.update.max_nonfinite_steps
    for i, name in enumerate(run.learners):
        run.nonfinite_streak[name] = run.nonfinite_streak.get(name, 0) + 1 if m.get(f"{name}/update/skipped_nonfinite") else 0
        if run.nonfinite_streak[name] >= limit:
            last = latest_checkpoint(run.run_dir)
            raise Diverged(
                f"step {step}: model {name}: a non-finite loss or gradient norm in {limit} consecutive steps "
                f"(update.max_nonfinite_steps={limit}); stopped, the last checkpoint is "
                f"{last or 'none (no checkpoint was saved yet)'}; lower models.{i}.lr"
            )


def summarize(run: Run, seconds: float, final: Path | None) -> dict:
    rows = run.metrics.read()
    out: dict[str, Any] = {
        "run_dir": str(run.run_dir),
        "steps": len(rows),
        "wall_clock_s": round(seconds, 1),
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "reward_workers_peak_rss_gb": round(run.grader.peak_rss_gb, 2),
        "final_checkpoint": str(final) if final else None,
        "models": {},
    }
    for name in run.learners:
        r = [v for x in rows if (v := x.get(f"{name}/reward/mean")) is not None]
        k = max(1, min(3, len(r) // 2))
        out["models"][name] = {
            "reward_first": r[0] if r else None,
            "reward_last": r[-1] if r else None,
            f"reward_first{k}_mean": sum(r[:k]) / k if r else None,
            f"reward_last{k}_mean": sum(r[-k:]) / k if r else None,
            "peer_responses_trained": sum(x.get(f"{name}/peer_responses", 0) or 0 for x in rows),
            "peer_row_share": _mean_of(rows, f"{name}/peer_row_share"),
            "tokens_generated": sum(
                x.get(f"{name}/dynamic/tokens_generated", x.get(f"{name}/tokens/generated", 0)) or 0 for x in rows
            ),
        }
    admitted_keys = sorted({k for x in rows for k in x if k.startswith("exchange/") and k.endswith("/admitted")})
    out["exchange"] = {k.split("/")[1]: sum(x.get(k, 0) or 0 for x in rows) for k in admitted_keys}
    out["exchange_correct"] = {k.split("/")[1]: sum(x.get(k + "_correct", 0) or 0 for x in rows) for k in admitted_keys}
    # exchange_s_p50: per step, the median s of every transferred response, admitted or dropped by the gate
    out["exchange_s_p50"] = {k.split("/")[1]: [x.get(k.replace("/admitted", "/s_p50")) for x in rows] for k in admitted_keys}
    out["exchange_s_p50_admitted"] = {  # a run logged before this metric existed has no entry
        k.split("/")[1]: [x.get(m) for x in rows]
        for k in admitted_keys
        if any((m := k.replace("/admitted", "/s_p50_admitted")) in x for x in rows)
    }
    out["exchange_steps"] = {k.split("/")[1]: sum(1 for x in rows if (x.get(k) or 0) > 0) for k in admitted_keys}
    out["exchange_expected"] = run.exchange.hands_over
    out["exchange_description"] = run.exchange.describe().lines()
    if run.eval_history:
        out["eval_history"] = run.eval_history
    return out


def _mean_of(rows: list[dict], key: str) -> float | None:
    vals = [x[key] for x in rows if x.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def _s_medians(every: list, admitted: list | None) -> str:
    """The summary's median ``s`` per step with a transfer: of every transferred response (admitted and dropped
    alike), and beside it of the admitted ones only (``-``: the gate admitted none that step; ``admitted`` None: a
    run logged before that median existed). A step without a median has None (null in metrics.jsonl) or NaN."""
    steps = [i for i, x in enumerate(every) if x is not None and x == x]
    if not steps:
        return ""
    out = f"; median s per step of all transferred responses (admitted and dropped) {' '.join(f'{every[i]:.2f}' for i in steps)}"
    if admitted is not None:
        kept = [admitted[i] if i < len(admitted) else None for i in steps]
        out += f", of the admitted ones {' '.join(f'{x:.2f}' if x is not None and x == x else '-' for x in kept)}"
    return out


def print_summary(s: dict, file=sys.stderr) -> None:
    print("\n=== graft run summary ===", file=file)
    print(
        f"run dir: {s['run_dir']}   steps: {s['steps']}   wall clock: {s['wall_clock_s']:.0f}s   "
        f"peak memory: {s['peak_rss_gb']:.1f} GB (reward workers: {s.get('reward_workers_peak_rss_gb') or 0:.1f} GB)",
        file=file,
    )
    for line in s.get("exchange_description", []):
        print(f"  {line}", file=file)
    for name, m in s["models"].items():
        keys = [k for k in m if k.startswith("reward_first") and k != "reward_first"]
        first = m[keys[0]] if keys else None
        last = m[keys[0].replace("first", "last")] if keys else None
        fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
        print(
            f"  {name}: reward {fmt(first)} -> {fmt(last)} (mean of first/last steps), "
            f"peer responses trained on: {m['peer_responses_trained']}, tokens generated: {m['tokens_generated']}",
            file=file,
        )
    for d, n in s.get("exchange", {}).items():
        steps = s.get("exchange_steps", {}).get(d)
        correct = s.get("exchange_correct", {}).get(d)
        print(
            f"  exchange {d}: {n} peer responses admitted"
            + (f", {correct} of them correct" if correct is not None else "")
            + (f" (in {steps} of {s['steps']} steps)" if steps is not None else "")
            + _s_medians(s.get("exchange_s_p50", {}).get(d, []), s.get("exchange_s_p50_admitted", {}).get(d)),
            file=file,
        )
    for name, m in s["models"].items():
        if m.get("peer_row_share"):
            print(f"  {name}: peer rows were {100 * m['peer_row_share']:.2f} % of its update rows (mean over steps)", file=file)
    if s.get("exchange_expected") and s.get("steps") and not any(s.get("exchange", {}).values()):
        print(
            "  WARNING: no peer response was exchanged in this run: GRAFT trained exactly like GRPO. Balancing needs "
            "candidates in both directions of a pair in the same step (exchange/S->R/candidates in metrics.jsonl); "
            "more prompts per step (batch_prompts) or a task where each model solves prompts the other fails "
            f"(graft probe {s['run_dir']}/config.yaml --compat predicts it) make that likelier.",
            file=file,
        )
    elif any(s.get("exchange", {}).values()):
        print(f"  read the admitted peer responses: graft samples {s['run_dir']} --from peer", file=file)
    if s.get("final_checkpoint"):
        print(f"  final checkpoint: {s['final_checkpoint']}", file=file)
