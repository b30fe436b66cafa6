"""``graft experiment``: a seeded comparison of arms (GRPO, GRAFT, ablations, stored peers), run
resumably one training run at a time, each final checkpoint evaluated, everything summarised.

    graft experiment run configs/experiments/mini-repro.yaml [--max-minutes 85] [--only ARM ...]
    graft experiment summarize configs/experiments/mini-repro.yaml
    graft experiment status configs/experiments/mini-repro.yaml    # which runs are done, where each stands

A plan (YAML) names a base training config, common overrides, seeds, arms (each a list of
overrides, optionally its own seeds), the evaluation data and what the report compares::

    name: mini-repro
    config: ../default.yaml            # relative to the plan file
    runs: runs/mini-repro              # run folders (checkpoints, stores: large, not committed)
    results: results/mini-repro        # small files per run + summary.json + REPORT.md (committed)
    overrides: [steps=24, batch_prompts=8]
    seeds: [1, 2, 3]
    arms:
      grpo_n8: [exchange.kind=none]
      graft_n8: []
      grpo_n16: {overrides: [exchange.kind=none, rollout.n=16], seeds: [1]}
      peer_first: {overrides: [update.order=peer_first], seeds: [1]}
    stored: {from: grpo_n8, seeds: [1]}  # each model trained alone on the other's stored groups of that arm
    eval: {data: {test: ../../results/mini-repro/data/test.jsonl}, n: 8, temperature: 0.6, top_p: 0.95}
    order: [grpo_n8/1, graft_n8/1, stored_A/1, ...]   # optional run order; unlisted runs follow, arm by arm
    keep_checkpoints: false            # delete a run's checkpoints once its final one is evaluated (true: keep
                                       # all; [ARM or ARM/SEED, ...]: keep those, e.g. for `graft onestep --from`)
    base: true                         # also evaluate the starting weights once (summary.json "base")
    # what summarize compares (each optional; a plan without comparisons reports none)
    title: GRAFT vs GRPO               # REPORT.md's heading: "# NAME: TITLE on MODELS"
    comparisons:                       # NAME: ARM minus BASELINE, seed by seed (summary.json paired_diff_NAME)
      graft_minus_grpo_n8: {arm: graft_n8, baseline: grpo_n8}
      # a pre-registered test: a verdict on MODEL's difference once PAIRS seeds are paired (summary.json
      # decision_NAME; "confirmed" iff the Student-t 95 % interval lies above 0, no verdict before)
      confirm_gain: {arm: graft_n8, baseline: grpo_n8, decision: {model: gemma3, pairs: 8}}
    labels: {grpo_n8: GRPO n=8, graft_n8: GRAFT n=8}   # an arm's name in the report's sentences (default: ARM)
    clip_frac_peer: {peer_last: graft_n8, peer_first: peer_first}   # NAME: ARM whose peer-token clip rate it reports
    onestep: ../../results/study/onestep/summary.json   # a `graft onestep` summary: summary.json one_step_effect

A comparison whose baseline is the arm the stored peers' groups come from (``stored.from``) also sets the
stored runs' gain over that baseline beside the compared arm's (summary.json ``stored_vs_online``).

``run`` goes through the plan in order, arm by arm and seed by seed: a run whose ``summary.json``
exists is skipped, and so is one whose results are already recorded under ``results/`` (committed
from another machine), a run with a checkpoint is resumed, the others start; each finished run's final
checkpoint is evaluated per model (``graft eval`` with the run's own prompt format), analysed
(``graft analyze``: ``analysis.json``, ``analyze.txt``) and its small files are copied to
``results/ARM/seedS/``. ``--max-minutes`` stops starting new runs after that
long, so the whole plan runs as resumable pieces. Every run is the command printed before it
starts; rerunning it alone gives the same training metrics (same seed, same samples). Several
``run`` processes on one plan share the work (one per core with ``threads=1``, or one per machine on a
shared folder): each claims the run it works on and skips the runs the others hold.
"""
from __future__ import annotations

import json
import math
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from graft.config import ANSWER_FORMS as LEGACY_ANSWER_FORMS, ConfigError, EvalConfig, load_config, save_config, to_dict
from graft.data.arithmetic import FAMILIES, family_of
from graft.domains.base import config_domain
from graft.domains.math import WORKED_EQUATIONS
from graft.errors import UserError
from graft.evaluation import report as rep
from graft.evaluation.analyze import analyze, compute_analysis, read_jsonl, summary_text, treatment
from graft.evaluation.metrics import paired_interval, paired_verdict
from graft.exchange.kinds import hands_over
from graft.parsers import experiment_parser
from graft.reward.shortcuts import FLAGS, chance_level, shortcut_shares
from graft.reward.verifier import extract_boxed, is_number, verify_number
from graft.storage.checkpoint import checkpoint_step, latest_checkpoint
from graft.storage.lock import FolderLock, LockError, holder
from graft.trainer.stop import PREEMPTED_EXIT, Preempted, StopSignal

SMALL_FILES = ("config.yaml", "metrics.jsonl", "audit.jsonl", "summary.json", "analysis.json", "analyze.txt")

PLAN_KEYS = ("name", "config", "runs", "results", "overrides", "seeds", "arms", "stored", "eval", "order",
             "keep_checkpoints", "base", "title", "comparisons", "labels", "clip_frac_peer", "onestep")

STORED_PREFIX = "stored_"
"""Arm name prefix of the stored-peer runs (``stored_MODEL``): the plan's own arms may not use it."""


ANSWER_FORMS = {domain: form for form, domain in LEGACY_ANSWER_FORMS.items()}
"""``reward.domain`` -> the summary's ``answer_form`` (its name before domains, :data:`graft.config.ANSWER_FORMS`)."""


@dataclass
class Member:
    """One training run of the plan."""

    arm: str
    seed: int
    overrides: list[str]
    run_dir: Path
    results_dir: Path
    models: list[str] = field(default_factory=list)
    """Models this run trains (all of the base config's, or one for a stored-peer run)."""
    evaluated: bool = True
    """Its final checkpoint is evaluated (a plan with eval data); a pilot without eval data never
    touches evaluation prompts."""
    store: Path | None = None
    """A stored-peer run's source: the trajectory store of the run whose groups it trains on."""
    exchanges: bool = False
    """Its config hands groups between models (:func:`graft.exchange.kinds.hands_over`: every ``exchange.kind`` but
    ``none``)."""

    @property
    def eval_models(self) -> list[str]:
        return self.models if self.evaluated else []

    def train_overrides(self) -> list[str]:
        """The ``key=value`` overrides of this run's ``graft train`` on the plan's config."""
        return [*self.overrides, f"seed={self.seed}", f"run_dir={self.run_dir}"]

    def command(self, config: Path) -> list[str]:
        return [sys.executable, "-m", "graft.cli", "train", str(config), *self.train_overrides()]


@dataclass(frozen=True)
class Comparison:
    """A paired difference the report makes, seed by seed: ``arm`` minus ``baseline``."""

    name: str
    """Its summary.json keys: ``paired_diff_NAME`` (per seed) and ``paired_ci_NAME`` (their mean and Student-t
    95 % interval) and, strict re-grade, the same with ``_number``."""
    arm: str
    baseline: str
    decision: tuple[str, int] | None = None
    """A pre-registered verdict: (model, pairs) -- :func:`paired_verdict` on that model's differences (summary.json
    ``decision_NAME``)."""


@dataclass
class Plan:
    name: str
    config: Path
    runs: Path
    results: Path
    members: list[Member]
    eval: dict
    models: list[str]
    keep_checkpoints: bool | frozenset[str] = True
    """Keep every run's checkpoints (True), none once evaluated (False), or those of the named arms and
    ``ARM/SEED`` runs."""
    answer_form: str = "any"
    """The runs' ``reward.domain`` under its earlier name (``math`` is ``any``; stored-peer runs share it), or
    ``mixed`` when arms differ."""
    common: list[str] = field(default_factory=list)
    """The plan's overrides common to every run."""
    base: bool = False
    """Evaluate the starting weights too (``base: true``): summary.json's ``base``."""
    stored_from: str | None = None
    """The arm whose stored groups the stored-peer runs train on."""
    title: str | None = None
    """What REPORT.md's heading says the plan compares."""
    comparisons: list[Comparison] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    """An arm's name in the report's sentences (an arm without one: its own name)."""
    clip_frac_peer: dict[str, str] = field(default_factory=dict)
    """summary.json ``clip_frac_peer`` name -> the arm whose lowest seed's peer-token clip rate it reports."""
    onestep: Path | None = None
    """A ``graft onestep`` summary.json whose paired effects summary.json reports (``one_step_effect``)."""

    def arms(self) -> dict[str, list[Member]]:
        out: dict[str, list[Member]] = {}
        for m in self.members:
            out.setdefault(m.arm, []).append(m)
        return out

    def keeps_checkpoints(self, m: Member) -> bool:
        k = self.keep_checkpoints
        return k if isinstance(k, bool) else m.arm in k or f"{m.arm}/{m.seed}" in k

    def label(self, arm: str) -> str:
        return self.labels.get(arm, arm)


def load_plan(path: str | Path) -> Plan:
    """Read and check a plan; every member's config is validated before anything runs."""
    path = Path(path)
    raw = _read_plan(path)
    base = (path.parent / raw.get("config", "")).resolve()
    common, seeds = list(raw.get("overrides", [])), list(raw.get("seeds", [0]))
    runs, results = Path(raw.get("runs", f"runs/{path.stem}")), Path(raw.get("results", f"results/{path.stem}"))
    cfg = load_config(base, common)
    models = [m.name for m in cfg.models]
    arm_names = _arm_names(path, raw.get("arms") or {})
    declared = _report_declarations(path, raw, arm_names, models)
    stored = _stored_spec(path, raw.get("stored"), arm_names)
    members = _arm_members(path, raw.get("arms") or {}, common, seeds, runs, results, models)
    if stored:
        members += _stored_members(path, stored, cfg, common, seeds, runs, results)
    _sort_members(path, members, [str(x) for x in raw.get("order") or []])
    forms = set()
    for m in members:
        if m.store is None:
            run_cfg = load_config(base, m.overrides + [f"seed={m.seed}"])
            forms.add(ANSWER_FORMS.get(run_cfg.reward.domain, run_cfg.reward.domain))
            m.exchanges = hands_over(run_cfg)
    ev = dict(raw.get("eval") or {})
    ev["data"] = {k: str((path.parent / v).resolve()) for k, v in (ev.get("data") or {}).items()}
    for m in members:
        m.evaluated = bool(ev["data"])
    return Plan(raw.get("name", path.stem), base, runs, results, members, ev, models,
                keep_checkpoints=_keep_checkpoints(path, raw.get("keep_checkpoints", True), members),
                answer_form=forms.pop() if len(forms) == 1 else "mixed", common=common,
                base=bool(raw.get("base", False)), stored_from=stored["from"] if stored else None, **declared)


def _keep_checkpoints(path: Path, spec: Any, members: list[Member]) -> bool | frozenset[str]:
    if isinstance(spec, bool):
        return spec
    if not isinstance(spec, list):
        raise ConfigError(f"{path}: keep_checkpoints: expected true, false or a list of ARM or ARM/SEED, got {spec!r}")
    known = {m.arm for m in members} | {f"{m.arm}/{m.seed}" for m in members}
    unknown = [str(x) for x in spec if str(x) not in known]
    if unknown:
        raise ConfigError(f"{path}: keep_checkpoints: the plan has no arm or run {unknown[0]!r} "
                          f"(its arms: {sorted({m.arm for m in members})}; a run is ARM/SEED)")
    return frozenset(map(str, spec))


def _read_plan(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"experiment plan not found: {path}")
    raw = yaml.safe_load(path.read_text()) or {}
    unknown = set(raw) - set(PLAN_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {sorted(unknown)}")
    return raw


def _arm_names(path: Path, arms: dict) -> list[str]:
    names = [str(a) for a in arms]
    for arm in names:
        if arm.startswith(STORED_PREFIX):
            raise ConfigError(f"{path}: arms.{arm}: names starting with {STORED_PREFIX!r} are the stored-peer runs'")
    return names


def _arm_members(path: Path, arms: dict, common: list[str], seeds: list[int], runs: Path, results: Path,
                 models: list[str]) -> list[Member]:
    """One member per arm and seed, in the order the plan lists them."""
    members = []
    for arm, spec in arms.items():
        arm = str(arm)
        overrides, arm_seeds = _arm(path, arm, spec, seeds)
        for s in arm_seeds:
            members.append(Member(arm, s, common + overrides, runs / arm / f"seed{s}", results / "runs" / arm / f"seed{s}",
                                  models))
    return members


def _arm(path: Path, arm: str, spec: Any, seeds: list[int]) -> tuple[list[str], list[int]]:
    """An arm's overrides and seeds: ``[OVERRIDE, ...]`` or ``{overrides: [...], seeds: [...]}``."""
    if isinstance(spec, dict):
        unknown = set(spec) - {"overrides", "seeds"}
        if unknown:
            raise ConfigError(f"{path}: arms.{arm}: unknown key(s) {sorted(unknown)} (has overrides, seeds)")
        return list(spec.get("overrides", [])), list(spec.get("seeds", seeds))
    return list(spec or []), seeds


def _stored_spec(path: Path, spec: Any, arms: list[str]) -> dict | None:
    if not spec:
        return None
    if not isinstance(spec, dict) or set(spec) - {"from", "seeds"}:
        raise ConfigError(f"{path}: stored: expected {{from: ARM, seeds: [...]}}, got {spec!r}")
    return {**spec, "from": _arm_name(path, "stored.from", spec.get("from"), arms)}


def _stored_members(path: Path, stored: dict, cfg, common: list[str], seeds: list[int], runs: Path,
                    results: Path) -> list[Member]:
    """Per stored seed, each model of the pair trained alone on the other's groups stored by the ``from`` arm."""
    models = [m.name for m in cfg.models]
    if len(models) != 2:
        raise ConfigError(f"{path}: stored-peer arms need a pair of models, got {models}")
    members = []
    for s in stored.get("seeds", seeds[:1]):
        src = runs / stored["from"] / f"seed{s}" / "trajectories"
        for i, recv in enumerate(models):
            extra = [f"models=[{_model_yaml(cfg.models[i])}]", "exchange.kind=stored", f"peer.store_path={src}",
                     f"peer.store_model={models[1 - i]}"]
            arm = f"{STORED_PREFIX}{recv}"
            members.append(Member(arm, s, common + extra, runs / arm / f"seed{s}", results / "runs" / arm / f"seed{s}",
                                  [recv], store=src))
    return members


def _sort_members(path: Path, members: list[Member], order: list[str]) -> None:
    """Put the runs ``order`` names first, in its order (``ARM/SEED``); the others keep theirs."""
    keys = [f"{m.arm}/{m.seed}" for m in members]
    unknown_runs = [o for o in order if o not in keys]
    if unknown_runs:
        raise ConfigError(f"{path}: order names runs that the plan does not have: {unknown_runs} (have {keys})")
    members.sort(key=lambda m: order.index(f"{m.arm}/{m.seed}") if f"{m.arm}/{m.seed}" in order else len(order))


def _report_declarations(path: Path, raw: dict, arms: list[str], models: list[str]) -> dict:
    """The plan's ``title``, ``comparisons``, ``labels``, ``clip_frac_peer`` and ``onestep``, every arm name checked."""
    title = raw.get("title")
    if title is not None and not isinstance(title, str):
        raise ConfigError(f"{path}: title: expected a string, got {title!r}")
    labels = _mapping(path, "labels", raw.get("labels"))
    for arm, text in labels.items():
        _arm_name(path, f"labels.{arm}", arm, arms)
        if not isinstance(text, str):
            raise ConfigError(f"{path}: labels.{arm}: expected a string, got {text!r}")
    clip = {str(k): _arm_name(path, f"clip_frac_peer.{k}", v, arms)
            for k, v in _mapping(path, "clip_frac_peer", raw.get("clip_frac_peer")).items()}
    comparisons = [_comparison(path, str(k), v, arms, models)
                   for k, v in _mapping(path, "comparisons", raw.get("comparisons")).items()]
    onestep = raw.get("onestep")
    if onestep is not None and not isinstance(onestep, str):
        raise ConfigError(f"{path}: onestep: expected the path of a `graft onestep` summary.json, got {onestep!r}")
    return {"title": title, "comparisons": comparisons, "labels": labels, "clip_frac_peer": clip,
            "onestep": None if onestep is None else (path.parent / onestep).resolve()}


def _comparison(path: Path, name: str, spec: Any, arms: list[str], models: list[str]) -> Comparison:
    key = f"comparisons.{name}"
    if not isinstance(spec, dict) or not {"arm", "baseline"} <= set(spec) <= {"arm", "baseline", "decision"}:
        raise ConfigError(f"{path}: {key}: expected {{arm: ARM, baseline: ARM}} (and optionally decision: "
                          f"{{model: MODEL, pairs: N}}), got {spec!r}")
    c = Comparison(name, _arm_name(path, f"{key}.arm", spec["arm"], arms),
                   _arm_name(path, f"{key}.baseline", spec["baseline"], arms),
                   _decision(path, f"{key}.decision", spec.get("decision"), models))
    if c.arm == c.baseline:
        raise ConfigError(f"{path}: {key}: compares arm {c.arm!r} with itself")
    return c


def _decision(path: Path, key: str, spec: Any, models: list[str]) -> tuple[str, int] | None:
    if spec is None:
        return None
    if not isinstance(spec, dict) or set(spec) != {"model", "pairs"}:
        raise ConfigError(f"{path}: {key}: expected {{model: MODEL, pairs: N}}, got {spec!r}")
    if spec["model"] not in models:
        raise ConfigError(f"{path}: {key}.model: the plan's runs have no model {spec['model']!r} (models: {models})")
    if isinstance(spec["pairs"], bool) or not isinstance(spec["pairs"], int) or spec["pairs"] < 2:
        raise ConfigError(f"{path}: {key}.pairs: expected an integer >= 2 (an interval needs two pairs), "
                          f"got {spec['pairs']!r}")
    return spec["model"], spec["pairs"]


def _mapping(path: Path, key: str, spec: Any) -> dict:
    if spec is None:
        return {}
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: {key}: expected a mapping, got {spec!r}")
    return spec


def _arm_name(path: Path, key: str, arm: Any, arms: list[str]) -> str:
    if arm not in arms:
        raise ConfigError(f"{path}: {key}: the plan has no arm {arm!r} (its arms: {arms})")
    return arm


def _model_yaml(m) -> str:
    """A model's config as a one-line YAML flow mapping (for a ``models=[...]`` override)."""
    return json.dumps(to_dict(m))


# ----------------------------------------------------------------------------- running

def _finished_in(folder: Path, eval_dir: str, models: list[str]) -> bool:
    return (folder / "summary.json").is_file() and all(
        (folder / eval_dir / name / "results.json").is_file() for name in models)


def _done(m: Member) -> bool:
    return _finished_in(m.run_dir, "eval_final", m.eval_models)


def _recorded(m: Member) -> bool:
    """Its small files and every model's eval results are under ``results/`` (run elsewhere, or its
    run folder is gone): the record stands, ``experiment run`` does not train it again."""
    return _finished_in(m.results_dir, "eval", m.eval_models)


def run_member(plan: Plan, m: Member, log) -> None:
    if not (m.run_dir / "summary.json").is_file():
        cmd = m.command(plan.config) + (["resume=true"] if m.run_dir.exists() else [])
        log(f"$ {shlex.join(cmd)}")
        _run(cmd, f"{m.arm}/seed{m.seed}")
    final = latest_checkpoint(m.run_dir)
    for name in m.eval_models:
        if final is None:
            raise RunFailed(f"{m.run_dir}: trained, but no checkpoint is left to evaluate (checkpoint.save_final "
                            "is off, or its checkpoints were removed)")
        out = m.run_dir / "eval_final" / name
        if (out / "results.json").is_file():
            continue
        cmd = eval_command(plan, str(final / name), m.run_dir / "config.yaml", name, out)
        log(f"$ {shlex.join(cmd)}")
        _run(cmd, f"{name} of {m.arm}/seed{m.seed}")
    write_analysis(m)
    copy_small_files(m)
    if not plan.keeps_checkpoints(m):
        shutil.rmtree(m.run_dir / "checkpoints", ignore_errors=True)


def eval_command(plan: Plan, model: str, config: Path, name: str, out: Path) -> list[str]:
    """``graft eval`` of one model on the plan's eval sets in ``config``'s prompt format (``model``: a
    checkpoint folder, or ``base`` for the config's starting weights)."""
    cmd = [sys.executable, "-m", "graft.cli", "eval", "--model", model, "--config", str(config), "--model-name", name,
           "--out", str(out), "--no-progress", "--n", str(plan.eval.get("n", EvalConfig.n)),
           "--repeats", str(plan.eval.get("repeats", EvalConfig.repeats)),
           "--temperature", str(plan.eval.get("temperature", EvalConfig.temperature)),
           "--top-p", str(plan.eval.get("top_p", EvalConfig.top_p)), "--seed", str(plan.eval.get("seed", 0))]
    for dname, dpath in plan.eval["data"].items():
        cmd += ["--data", f"{dname}={dpath}"]
    return cmd


def base_member(plan: Plan) -> Member:
    """The plan's starting weights as a pseudo-run: evaluated once per model (``results/base/``), never trained."""
    return Member("base", 0, [], plan.runs / "base", plan.results / "base", list(plan.models), bool(plan.eval["data"]))


def evaluate_base(plan: Plan, log) -> None:
    """Evaluate every model's starting weights on the plan's eval sets, in the prompt format of the plan's
    common config, once (skipped when ``results/base/MODEL/results.json`` exists)."""
    m = base_member(plan)
    todo = [a for a in m.eval_models if not (m.results_dir / "eval" / a / "results.json").is_file()]
    if not todo:
        return
    m.run_dir.mkdir(parents=True, exist_ok=True)
    save_config(load_config(plan.config, plan.common), m.run_dir / "config.yaml")
    for name in todo:
        out = m.run_dir / "eval_final" / name
        if not (out / "results.json").is_file():
            cmd = eval_command(plan, "base", m.run_dir / "config.yaml", name, out)
            log(f"$ {shlex.join(cmd)}")
            _run(cmd, f"{name}'s starting weights")
    copy_small_files(m)


class RunFailed(UserError):
    """A command of the plan failed; it printed its own error above. One ``error:`` line, no traceback."""


def _run(cmd: list[str], what: str) -> None:
    """Run one command of the plan (``what``: the run or model it works on, for its error line); it stopping on a
    signal (its exit status ``PREEMPTED_EXIT``, or killed by one before its handler was in place) stops the plan,
    resumably; any other failure stops it with one line."""
    rc = subprocess.run(cmd).returncode
    if rc == PREEMPTED_EXIT:
        raise Preempted(f"graft {cmd[3]} stopped on a signal after checkpointing; continue with `graft experiment run` "
                        "on the same plan")
    if rc < 0:
        raise Preempted(f"graft {cmd[3]} was killed by {signal.Signals(-rc).name} before it could checkpoint; continue "
                        "with `graft experiment run` on the same plan (the run resumes from its last checkpoint)")
    if rc:
        raise RunFailed(f"`graft {cmd[3]}` of {what} failed with exit status {rc} (its error is above); fix it and "
                        "run `graft experiment run` on the same plan again: finished runs are kept")


def write_analysis(m: Member) -> None:
    """``graft analyze``'s record of a trained run, once: ``analysis.json`` and the printed summary
    ``analyze.txt`` (treatment, reward monitor, s, clip rates), read from its store before the store is
    left behind."""
    if not ((m.run_dir / "analysis.json").is_file() and (m.run_dir / "analyze.txt").is_file()):
        (m.run_dir / "analyze.txt").write_text(summary_text(analyze(m.run_dir)) + "\n")


def copy_small_files(m: Member) -> None:
    """The run's config, metrics, audit log, summary and evaluation results (never checkpoints or stores)."""
    m.results_dir.mkdir(parents=True, exist_ok=True)
    for f in SMALL_FILES:
        if (m.run_dir / f).is_file():
            shutil.copy2(m.run_dir / f, m.results_dir / f)
    for name in m.models:
        src = m.run_dir / "eval_final" / name
        for f in ("results.json", "results.md"):
            if (src / f).is_file():
                (m.results_dir / "eval" / name).mkdir(parents=True, exist_ok=True)
                shutil.copy2(src / f, m.results_dir / "eval" / name / f)
        for graded in src.glob("*/repeat_*.jsonl"):   # the graded responses (~100 kB a set): every grade can be re-checked
            (m.results_dir / "eval" / name / graded.parent.name).mkdir(parents=True, exist_ok=True)
            shutil.copy2(graded, m.results_dir / "eval" / name / graded.parent.name / graded.name)


def run_plan(plan: Plan, max_minutes: float | None = None, only: list[str] | None = None) -> list[Member]:
    """Run every unfinished member (of ``only`` arms), in plan order; returns the members still unfinished.

    Each run (and the base evaluation) is claimed while it is worked on (a lock under ``RUNS/.claims``), so
    ``experiment run`` started several times on the same plan -- once per core with ``threads=1``, or on
    machines sharing the folder -- works through it together: each takes the next unclaimed run and skips
    the ones another holds. A SIGTERM/SIGINT stops it after the current run (which itself checkpoints and
    stops when it got the signal too)."""
    with StopSignal("the current run") as stop:
        return _run_plan(plan, stop, max_minutes, only)


def _claim_folder(plan: Plan, name: str) -> Path:
    return plan.runs / ".claims" / name.replace("/", "-")


def claim(plan: Plan, name: str) -> FolderLock | None:
    """The lock that says this process works on run ``name`` (``ARM/seedS`` or ``base``) of the plan, or
    None (and nothing written) when another process holds it."""
    try:
        return FolderLock(_claim_folder(plan, name), f"run {name} of plan {plan.name}").acquire()
    except LockError:
        return None


def _run_plan(plan: Plan, stop: StopSignal, max_minutes: float | None, only: list[str] | None) -> list[Member]:
    t0 = time.monotonic()
    log = lambda s: print(f"[experiment {plan.name}] {s}", file=sys.stderr, flush=True)  # noqa: E731
    todo = [m for m in plan.members if only is None or m.arm in only]
    if plan.base and (only is None or "base" in only):
        if (held := claim(plan, "base")) is None:
            log("skip the base evaluation: another `experiment run` of this plan holds it")
        else:
            with held:
                evaluate_base(plan, log)
    for m in todo:
        if stop.requested:
            raise Preempted(f"{stop.requested}: stopped after the current run; continue with `graft experiment run` "
                            "on the same plan")
        if _done(m):
            write_analysis(m)
            copy_small_files(m)
            continue
        if _recorded(m):
            log(f"skip {m.arm}/seed{m.seed}: its results are recorded in {m.results_dir} (move them away to run it again)")
            continue
        if m.store is not None and not (m.store.parent / "summary.json").is_file():
            log(f"skip {m.arm}/seed{m.seed}: its peer's trajectory store ({m.store}) is not here; "
                "its run has not finished on this machine")
            continue
        if max_minutes is not None and (time.monotonic() - t0) / 60 > max_minutes:
            log(f"stopping after {max_minutes:g} minutes; rerun the same command to continue")
            break
        if (held := claim(plan, f"{m.arm}/seed{m.seed}")) is None:
            log(f"skip {m.arm}/seed{m.seed}: another `experiment run` of this plan holds it")
            continue
        with held:
            if _done(m) or _recorded(m):   # another process finished it between the checks above and the claim
                log(f"skip {m.arm}/seed{m.seed}: another `experiment run` of this plan finished it")
                continue
            log(f"{m.arm} seed {m.seed}: {m.run_dir}")
            run_member(plan, m, log)
    return [m for m in todo if not (_done(m) or _recorded(m))]


def member_state(m: Member, steps: int) -> str:
    """Where one run of the plan stands: ``done``, ``trained (eval pending)``, ``step k/steps
    (resumes from checkpoint c)``, ``results only`` (its small files are here, its run folder is
    not: another machine ran it) or ``not started``."""
    if _done(m):
        return "done"
    if (m.run_dir / "summary.json").is_file():
        return "trained (eval pending)"
    if (m.run_dir / "metrics.jsonl").is_file():
        k = sum(1 for line in (m.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip())
        ck = latest_checkpoint(m.run_dir)
        return f"step {k}/{steps} " + (f"(resumes from checkpoint {checkpoint_step(ck)})" if ck else "(no checkpoint yet)")
    if _recorded(m):
        return "results only"
    return "not started"


def plan_status(plan: Plan) -> list[dict]:
    """One row per run, in run order: arm, seed, state (:func:`member_state`, and which ``experiment run``
    process works on it now, if one does)."""
    rows = []
    for m in plan.members:
        steps = load_config(plan.config, m.overrides + [f"seed={m.seed}"]).steps
        state = member_state(m, steps)
        if (who := holder(_claim_folder(plan, f"{m.arm}/seed{m.seed}"))) is not None:
            state += f", running ({who})"
        rows.append({"arm": m.arm, "seed": m.seed, "state": state, "run_dir": str(m.run_dir)})
    return rows


def check_only(plan: Plan, only: list[str] | None) -> None:
    """Refuse ``--only`` arms the plan does not have (rather than silently running nothing)."""
    unknown = sorted(set(only or []) - set(plan.arms()))
    if unknown:
        raise ConfigError(f"--only: the plan has no arm(s) {unknown} (it has {sorted(plan.arms())})")


# ----------------------------------------------------------------------------- summary

def _pass1(m: Member, model: str, dataset: str | None = None) -> float | None:
    path = m.results_dir / "eval" / model / "results.json"
    if not path.is_file():
        return None
    res = json.loads(path.read_text())
    if dataset is None:
        return res["macro"]["pass@1"]["mean"]
    d = res["datasets"].get(dataset)
    return d["pass@1"]["mean"] if d else None


CHANCE_FAMILY = 0.25
"""A problem family whose chance level (the reward of boxing a number of the question,
:func:`graft.reward.shortcuts.chance_level`) is at least this is left out of the skill-only pass@1 (``max``: 0.5)."""


def eval_family(prompt_id: str) -> str:
    """The problem family of an eval prompt id (``test_hard-max-00003`` -> ``max``; ``max-00003`` -> ``max``)."""
    name = family_of(prompt_id)
    return name.split("-", 1)[1] if "-" in name and name.split("-", 1)[1] in FAMILIES else name


def regraded_pass1(m: Member, model: str, problems: dict[str, str] | None = None) -> dict | None:
    """A finished run's stored eval responses re-graded with the strict rule (``reward.answer_form=number``:
    one final answer, the reference written in lowest terms; :func:`graft.reward.verifier.verify_number`):

    - ``pass@1``: macro over the eval data sets; ``pass@1_skill``: the same without the families whose
      chance level is at least :data:`CHANCE_FAMILY` (``max``), where an answer can be read off the question;
    - ``expression_share_of_correct`` / ``expression_share_of_boxed``: responses whose box held an
      expression, among those the run's own grading counted correct / among all with a non-empty box;
    - ``monitor``: :func:`graft.reward.shortcuts.shortcut_shares` of the responses the run's own grading
      rewarded (``as_run``) and of those the strict rule rewards (``strict``);
    - ``families``: per problem family, strict pass@1 and chance level.

    ``problems``: prompt id -> problem text, for eval files that do not record it (:func:`eval_problems`).
    ``None`` when the responses were not kept, or when the run's domain is not a boxed-answer one (``code``, a
    user's: the strict rule means nothing there; its monitor is in each run's ``analyze.txt``)."""
    if _run_domain(m) not in ("math", "number"):
        return None
    per_set, per_set_skill, correct, expr_correct, boxed, expr_boxed = [], [], 0, 0, 0, 0
    texts, questions, as_run, strict_all = [], [], [], []
    fams: dict[str, dict[str, list[float]]] = {}
    for path in sorted((m.results_dir / "eval" / model).glob("*/repeat_*.jsonl")):
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        per_prompt, skill = [], []
        for r in rows:
            problem = r.get("problem") or (problems or {}).get(r["id"])
            strict = [verify_number(resp, r["answer"])[0] for resp in r["responses"]]
            per_prompt.append(sum(strict) / len(strict))
            chance = chance_level(problem, r["answer"]) if problem else 0.0
            f = fams.setdefault(eval_family(r["id"]), {"pass@1": [], "chance": []})
            f["pass@1"].append(per_prompt[-1])
            f["chance"].append(chance)
            texts += r["responses"]
            questions += [problem or ""] * len(r["responses"])
            as_run += r["rewards"]
            strict_all += strict
            for resp, old in zip(r["responses"], r["rewards"], strict=True):   # one reward per response
                content = extract_boxed(resp)
                expression = bool(content and not is_number(content))
                boxed += bool(content)
                expr_boxed += expression
                if old == 1.0:
                    correct += 1
                    expr_correct += expression
        if per_prompt:
            per_set.append(sum(per_prompt) / len(per_prompt))
        skill = [p for r, p in zip(rows, per_prompt, strict=True) if _below_chance_cut(fams[eval_family(r["id"])]["chance"])]
        if skill:
            per_set_skill.append(sum(skill) / len(skill))
    if not per_set:
        return None
    return {"pass@1": sum(per_set) / len(per_set),
            "pass@1_skill": sum(per_set_skill) / len(per_set_skill) if per_set_skill else None,
            "expression_share_of_correct": expr_correct / correct if correct else None,
            "expression_share_of_boxed": expr_boxed / boxed if boxed else None,
            "monitor": {"as_run": shortcut_shares(texts, questions, as_run, WORKED_EQUATIONS),
                        "strict": shortcut_shares(texts, questions, strict_all, WORKED_EQUATIONS)},
            "families": {f: {"pass@1": _mean(v["pass@1"]), "chance": _mean(v["chance"]), "prompts": len(v["pass@1"])}
                         for f, v in sorted(fams.items())}}


def _run_domain(m: Member) -> str:
    """The ``reward.domain`` a recorded run trained with (``math`` when its config is not recorded)."""
    path = m.results_dir / "config.yaml"
    try:
        tree = yaml.safe_load(path.read_text()) if path.is_file() else {}
    except (OSError, yaml.YAMLError):
        tree = {}
    return config_domain(tree if isinstance(tree, dict) else {}).name


def eval_problems(plan: Plan) -> dict[str, str]:
    """Prompt id -> problem text of every eval data set of a plan."""
    out = {}
    for spec in plan.eval.get("data", {}).values():
        path = Path(spec)
        if path.is_file():
            for line in path.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    out[str(row["id"])] = row["problem"]
    return out


def _metrics(m: Member) -> list[dict]:
    p = m.results_dir / "metrics.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.is_file() else []


def _exchange_total(m: Member, direction: str, key: str = "admitted") -> int | None:
    """Sum of ``exchange/{direction}/{key}`` over a finished run's steps; None for a run not finished yet."""
    rows = _metrics(m)
    return int(sum(r.get(f"exchange/{direction}/{key}") or 0 for r in rows)) if rows else None


def _treatment(m: Member, direction: str) -> dict | None:
    """:func:`graft.evaluation.analyze.treatment` of a finished run's direction (metrics and audit log), the one
    definition of its counts and drift; None for a run not finished yet."""
    rows = _metrics(m)
    return treatment(rows, read_jsonl(m.results_dir / "audit.jsonl"), direction) if rows else None


def _exchange_steps(m: Member, direction: str, t: dict | None) -> dict | None:
    """Per finished run and direction (``t``: its :func:`_treatment`): steps with a balanced target m > 0, steps
    with an admitted response, and the median s of the responses transferred in the first and in the last third
    of training."""
    if t is None:
        return None
    rows, pre, first, last = _metrics(m), f"exchange/{direction}", t["first_third"], t["last_third"]
    return {"steps": len(rows), "with_target": sum((r.get(f"{pre}/m") or 0) > 0 for r in rows),
            "with_admitted": sum((r.get(f"{pre}/admitted") or 0) > 0 for r in rows),
            "s_median_first_third": first and first["s_median"], "s_median_last_third": last and last["s_median"]}


def _admitted_correct(m: Member, t: dict | None) -> int | None:
    """Peer responses admitted over the run that the source graded correct (``t``: the direction's
    :func:`_treatment`); None without an audit log."""
    return t["admitted_correct"] if t is not None and (m.results_dir / "audit.jsonl").is_file() else None


def _peer_row_share(m: Member, model: str) -> float | None:
    """Mean over steps of the peer rows' share of ``model``'s update rows (``M/peer_row_share``)."""
    vals = [r[f"{model}/peer_row_share"] for r in _metrics(m) if r.get(f"{model}/peer_row_share") is not None]
    return _mean(vals) if vals else None


def _mean(xs: Sequence[float | None]) -> float | None:
    """Mean of the values that are neither None nor NaN; None when there are none."""
    kept = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(kept) / len(kept) if kept else None


def _below_chance_cut(chances: list[float]) -> bool:
    """Whether a problem family's mean chance level is under :data:`CHANCE_FAMILY` (:func:`regraded_pass1`)."""
    mean = _mean(chances)
    assert mean is not None, "each prompt of a family adds its (finite) chance level before the family is read"
    return mean < CHANCE_FAMILY


def _std(xs: Sequence[float | None]) -> float | None:
    kept = [x for x in xs if x is not None]
    if len(kept) < 2:
        return None
    mu = sum(kept) / len(kept)
    return math.sqrt(sum((x - mu) ** 2 for x in kept) / (len(kept) - 1))


def _clip_peer(m: Member, model_keys: list[str]) -> float | None:
    """Peer-token clip rate (low + high) over the run: the mean of the per-step fractions of the models in
    ``model_keys`` over the (step, model) pairs that trained on peer data; None when there are none."""
    vals = []
    for r in _metrics(m):
        for name in model_keys:
            lo, hi = r.get(f"{name}/clip_frac/peer_low"), r.get(f"{name}/clip_frac/peer_high")
            if (r.get(f"{name}/peer_responses") or 0) > 0 and lo is not None:
                vals.append(lo + (hi or 0.0))
    return _mean(vals)


def summarize(plan: Plan) -> dict:
    """``results/summary.json`` (the shape the mini reproduction promises, plus details)."""
    arms = {arm: members for arm, members in plan.arms().items() if members[0].store is None}
    problems = eval_problems(plan)
    out = _summary_skeleton(plan)
    for arm, members in arms.items():
        _add_arm(out, plan, arm, members, problems)
    for key, arm in plan.clip_frac_peer.items():
        if arm in arms:
            first = min(arms[arm], key=lambda m: m.seed)
            out["clip_frac_peer"][key] = _clip_peer(first, plan.models)
            out["clip_frac_peer_by_model"][key] = {a: _clip_peer(first, [a]) for a in plan.models}
    _add_stored(out, plan, arms, problems)
    if plan.base:
        bm = base_member(plan)
        out["base"] = {a: _pass1(bm, a) for a in plan.models}
        out["base_strict"] = {a: (regraded_pass1(bm, a, problems) or {}).get("pass@1") for a in plan.models}
    if plan.onestep is not None and plan.onestep.is_file():
        out.update(one_step_effect(json.loads(plan.onestep.read_text())))
    for c in plan.comparisons:
        if c.arm in arms and c.baseline in arms:
            out[f"paired_diff_{c.name}"] = _paired_diff(arms, c, out["arms"], plan.models)
            out[f"paired_diff_{c.name}_number"] = _paired_diff(arms, c, out["arms_answer_form_number"], plan.models)
            for suffix in ("", "_number"):
                out[f"paired_ci_{c.name}{suffix}"] = {a: paired_interval(ds)
                                                      for a, ds in out[f"paired_diff_{c.name}{suffix}"].items()}
        if c.decision is not None:
            model, pairs = c.decision
            diffs = out.get(f"paired_diff_{c.name}", {}).get(model, [])
            out[f"decision_{c.name}"] = {"model": model, **paired_verdict(diffs, pairs)}
    return out


def one_step_effect(onestep: dict) -> dict:
    """A ``graft onestep`` summary in the plan summary's terms: ``one_step_effect`` (GRAFT's update minus
    GRPO's, per direction and prompt kind: mean difference in success rate, 95 % interval, prompts),
    ``one_step_effect_gate_off`` (the same with ``exchange.admission=all``) and ``one_step_treatment``
    (states, selected prompts, admitted and admitted-correct peer responses per direction), ``one_step_states``
    (training states measured, and those with a prompt to exchange: elsewhere GRAFT's update is GRPO's)."""
    def cut(table: dict) -> dict:
        keys = ("mean", "ci95", "prompts", "states", "differed", "t95")   # the last two from arms version 2 on
        return {d: {kind: {k: s[k] for k in keys if k in s} for kind, s in kinds.items()} for d, kinds in table.items()}
    return {"one_step_effect": cut(onestep["graft_minus_grpo"]), "one_step_effect_gate_off": cut(onestep["all_minus_grpo"]),
            "one_step_treatment": onestep["treatment"], "one_step_states": onestep.get("states"),
            "one_step_command": onestep.get("command"),
            **({"one_step_verdict_interval": onestep["verdict_interval"]} if "verdict_interval" in onestep else {})}


def _summary_skeleton(plan: Plan) -> dict[str, Any]:
    """The summary's header and its per-arm tables, empty."""
    tables = ("arms", "by_dataset", "exchanged", "transferred", "exchange_steps", "clip_frac_peer",
              "clip_frac_peer_by_model", "stored", "arms_answer_form_number", "expression_share_of_correct",
              "expression_share_of_boxed", "stored_answer_form_number", "arms_strict_skill", "monitor", "families",
              "admitted_correct", "peer_row_share", "train_reward", "last_quarter")
    ev = {"data": {k: Path(v).name for k, v in plan.eval["data"].items()},
          "n": plan.eval.get("n", EvalConfig.n), "temperature": plan.eval.get("temperature", EvalConfig.temperature),
          "top_p": plan.eval.get("top_p", EvalConfig.top_p), "repeats": plan.eval.get("repeats", EvalConfig.repeats),
          "metric": "pass@1, macro average over the eval data sets", "answer_form": plan.answer_form}
    return {"models": plan.models, "seeds": sorted({m.seed for m in plan.members}), "eval": ev,
            **{key: {} for key in tables}}


REGRADED = (("arms_answer_form_number", "pass@1"), ("arms_strict_skill", "pass@1_skill"), ("monitor", "monitor"),
            ("families", "families"), ("expression_share_of_correct", "expression_share_of_correct"),
            ("expression_share_of_boxed", "expression_share_of_boxed"))
"""Summary table -> the :func:`regraded_pass1` field it holds per arm, model and seed."""


def _add_arm(out: dict, plan: Plan, arm: str, members: list[Member], problems: dict[str, str]) -> None:
    """One arm's row of every per-arm table; the exchange tables for an arm that exchanges."""
    A = plan.models
    out["arms"][arm] = {a: [_pass1(m, a) for m in members] for a in A}
    regraded = {a: [regraded_pass1(m, a, problems) for m in members] for a in A}
    for table, key in REGRADED:
        out[table][arm] = {a: [r and r[key] for r in rs] for a, rs in regraded.items()}
    out["by_dataset"][arm] = {a: {d: [_pass1(m, a, d) for m in members] for d in plan.eval["data"]} for a in A}
    out["train_reward"][arm] = {a: [_last_reward(m, a) for m in members] for a in A}
    out["last_quarter"][arm] = {a: [last_quarter(_metrics(m), a) for m in members] for a in A}
    dirs = [f"{s}->{r}" for s in A for r in A if s != r]
    if any(m.exchanges for m in members) or any(_exchange_total(m, d) for m in members for d in dirs):
        out["exchanged"][arm] = {d: [_exchange_total(m, d) for m in members] for d in dirs}
        out["transferred"][arm] = {d: [_exchange_total(m, d, "transferred") for m in members] for d in dirs}
        treated = {d: [(m, _treatment(m, d)) for m in members] for d in dirs}
        out["exchange_steps"][arm] = {d: [_exchange_steps(m, d, t) for m, t in mt] for d, mt in treated.items()}
        out["admitted_correct"][arm] = {d: [_admitted_correct(m, t) for m, t in mt] for d, mt in treated.items()}
        out["peer_row_share"][arm] = {a: [_peer_row_share(m, a) for m in members] for a in A}


def _add_stored(out: dict, plan: Plan, arms: dict[str, list[Member]], problems: dict[str, str]) -> None:
    """The stored-peer runs' pass@1 per receiving model and, for each comparison whose baseline is the arm
    their groups came from, their gain beside the compared arm's (``stored_vs_online``)."""
    versus = [c for c in plan.comparisons if c.baseline == plan.stored_from and c.arm in arms and c.baseline in arms]
    stored = plan.arms()
    for a in plan.models:
        members = stored.get(f"{STORED_PREFIX}{a}", [])
        out["stored"][a] = [_pass1(m, a) for m in members]
        out["stored_answer_form_number"][a] = [(regraded_pass1(m, a, problems) or {}).get("pass@1") for m in members]
        if members and versus:
            out.setdefault("stored_vs_online", {})[a] = [_stored_row(m, a, c, arms) for c in versus for m in members]


def _stored_row(m: Member, model: str, c: Comparison, arms: dict[str, list[Member]]) -> dict:
    """A stored-peer run, the comparison's baseline and arm of the same seed: pass@1 of each, gains, ratio."""
    def at(arm: str) -> float | None:
        return next((_pass1(x, model) for x in arms[arm] if x.seed == m.seed), None)

    stored, baseline, online = _pass1(m, model), at(c.baseline), at(c.arm)
    return {"seed": m.seed, "stored": stored, c.baseline: baseline, c.arm: online,
            **stored_vs_online(stored, baseline, online)}


def _paired_diff(arms: dict[str, list[Member]], c: Comparison, table: dict, models: list[str]) -> dict:
    """Per model, ``table``'s value of the comparison's arm minus its baseline's, for each seed of the arm
    (None where the baseline has no such seed or either run is missing)."""
    out = {}
    for a in models:
        baseline = dict(zip((m.seed for m in arms[c.baseline]), table[c.baseline][a], strict=True))   # a value per run
        out[a] = [None if x is None or baseline.get(m.seed) is None else x - baseline[m.seed]
                  for m, x in zip(arms[c.arm], table[c.arm][a], strict=True)]
    return out


def stored_vs_online(stored: float | None, baseline: float | None, online: float | None) -> dict:
    """Gain of training on a stored peer log and of exchanging online, both over the baseline of the same
    seed, and their ratio (the paper's "84 % of the online gain"): defined only when the online gain is > 0."""
    if stored is None or baseline is None or online is None:
        return {"stored_gain": None, "online_gain": None, "ratio": None}
    s_gain, o_gain = stored - baseline, online - baseline
    return {"stored_gain": s_gain, "online_gain": o_gain, "ratio": s_gain / o_gain if o_gain > 0 else None}


def _last_reward(m: Member, model: str, k: int = 4) -> float | None:
    rewards = [r.get(f"{model}/reward/mean") for r in _metrics(m)]
    logged = [x for x in rewards if x is not None]
    return _mean(logged[-k:]) if logged else None


def last_quarter(rows: list[dict], model: str) -> dict | None:
    """What STUDY.md's selection rule reads, over the last quarter of a run's steps (the last ceil(S/4) of S
    logged steps; steps 19-24 of 24): mean strict training reward, mean ``distinct_frac`` and the share of
    rewarded responses the monitor flags ``echo`` or ``example_copy``. Hand-worked: rewards 0.1 0.2 0.3 0.5 over
    4 steps -> the last 1 step, 0.5."""
    rows = [r for r in rows if r.get(f"{model}/reward/mean") is not None]
    if not rows:
        return None
    tail = rows[len(rows) - math.ceil(len(rows) / 4):]
    n = sum(r.get(f"{model}/rewarded/n") or 0 for r in tail)
    flagged = sum(((r.get(f"{model}/rewarded/echo") or 0) + (r.get(f"{model}/rewarded/example_copy") or 0))
                  * (r.get(f"{model}/rewarded/n") or 0) for r in tail)
    return {"steps": [tail[0].get("step"), tail[-1].get("step")],
            "reward": _mean([r[f"{model}/reward/mean"] for r in tail]),
            "distinct_frac": _mean([r.get(f"{model}/distinct_frac") for r in tail]),
            "echo_or_copy_share": flagged / n if n else None, "rewarded": n}


def _num2(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def _fmt(mean: float | None, std: float | None = None) -> str:
    if mean is None:
        return "–"
    return f"{100 * mean:.1f}" + (f" ± {100 * std:.1f}" if std is not None else "")


def _pts(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:+.1f} points"


def _seed_cells(xs: list) -> str:
    ys = [x for x in xs if x is not None]
    return _fmt(_mean(ys), _std(ys)) + f" [{len(ys)}]"


def _and(names: list[str]) -> str:
    return " and ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else "".join(names)


def report_markdown(plan: Plan, summary: dict, plots: dict[str, str]) -> str:
    """REPORT.md: pass@1 per arm, the strict re-grade, the declared comparisons, per data set, the exchange,
    the plots and the commands."""
    md = _pass1_section(plan, summary) + strict_section(plan, summary) + _stored_vs_online_lines(plan, summary)
    md += _paired_lines(plan, summary, "", "") + _decision_lines(plan, summary)
    md += _dataset_table(summary) + _exchange_section(summary)
    md += _last_quarter_table(summary) + _one_step_section(summary) + _plot_sections(plots) + _commands(plan)
    return "\n".join(md) + "\n"


def _pass1_section(plan: Plan, summary: dict) -> list[str]:
    """The heading and the table of pass@1 per arm and model, with the stored-peer and base rows."""
    A = summary["models"]
    title = f"{plan.name}: {plan.title}" if plan.title else plan.name
    md = [f"# {title} on {_and(A)}", ""]
    md += ["pass@1 (%) on held-out prompts (macro over " + ", ".join(summary["eval"]["data"]) +
           f"; n = {summary['eval']['n']} samples per prompt, T = {summary['eval']['temperature']}, "
           f"top-p {summary['eval']['top_p']}), mean ± std over seeds (seeds run per arm in brackets).", ""]
    md += ["| arm | " + " | ".join(A) + " | pair mean |", "|---|" + "---:|" * (len(A) + 1)]
    for arm, vals in summary["arms"].items():
        means = [_mean([x for x in vals[a] if x is not None]) for a in A]
        pair = _mean(means) if None not in means else None
        md.append(f"| {arm} | " + " | ".join(_seed_cells(vals[a]) for a in A) + f" | {_fmt(pair)} |")
    for a in A:
        xs = [x for x in summary["stored"].get(a, []) if x is not None]
        if xs:
            md.append(f"| stored peer ({a} receives) | " + " | ".join(_fmt(_mean(xs)) if b == a else "" for b in A) + " | |")
    if summary.get("base"):
        md.append("| base (starting weights) | " + " | ".join(_fmt(summary["base"][a]) for a in A) + " | |")
    return md


def _stored_vs_online_lines(plan: Plan, summary: dict) -> list[str]:
    md = []
    versus = [c for c in plan.comparisons if c.baseline == plan.stored_from]
    for a, rows in summary.get("stored_vs_online", {}).items():
        for c in versus:
            for r in (r for r in rows if c.arm in r and c.baseline in r):
                md += ["", f"Stored vs online, {a} (seed {r['seed']}): stored peer {_fmt(r['stored'])}, "
                       f"{plan.label(c.baseline)} {_fmt(r[c.baseline])}, {plan.label(c.arm)} {_fmt(r[c.arm])}: "
                       f"stored gain {_pts(r['stored_gain'])}, online gain {_pts(r['online_gain'])}, "
                       f"ratio {_ratio(r)} (paper: 84 %)."]
    return md


def _ratio(row: dict) -> str:
    if row["ratio"] is not None:
        return f"{100 * row['ratio']:.0f} %"
    if row["online_gain"] is None or row["stored_gain"] is None:
        return "not defined (a run is missing)"
    return "not defined (online gain ≤ 0)"


def _paired_lines(plan: Plan, summary: dict, suffix: str, grading: str) -> list[str]:
    """Each declared comparison's per-seed differences and their mean with a paired Student-t 95 % interval
    over seeds (summary.json ``paired_diff_NAME`` / ``paired_ci_NAME`` + ``suffix``)."""
    rows = _paired_rows(plan, summary, suffix)
    if not rows:
        return []
    return ["", f"Paired difference, same seed{grading} (points): per seed, and their mean with a Student-t 95 % "
                "interval over the pairs run so far (none from one pair). *Detectable*: the smallest true difference "
                "a paired t-test (α = 0.05, two-sided) finds with 80 % power at these pairs' number and spread.", "",
            "| comparison | model | per seed | mean [95 % CI] (pairs) | detectable |", "|---|---|---|---:|---:|",
            *rows]


def _paired_rows(plan: Plan, summary: dict, suffix: str) -> list[str]:
    """The paired table's rows as printed, one per comparison and model (equal rows: the same table)."""
    rows = []
    for c in plan.comparisons:
        diff, ci = summary.get(f"paired_diff_{c.name}{suffix}"), summary.get(f"paired_ci_{c.name}{suffix}") or {}
        for a, ds in (diff or {}).items():
            rows.append(f"| {plan.label(c.arm)} − {plan.label(c.baseline)} | {a} | "
                        + ", ".join("–" if d is None else f"{100 * d:+.1f}" for d in ds)
                        + f" | {_paired_ci(ci.get(a))} | {_detectable(ci.get(a))} |")
    return rows


def _decision_lines(plan: Plan, summary: dict) -> list[str]:
    """Each pre-registered decision's verdict, or how many pairs it still waits for."""
    md = []
    for c in plan.comparisons:
        d = summary.get(f"decision_{c.name}")
        if d is None:
            continue
        what = (f"Pre-registered decision ({c.name}): {plan.label(c.arm)} − {plan.label(c.baseline)} on {d['model']}, "
                f"confirmed iff the Student-t 95 % interval over {d['pairs_required']} paired seeds lies above 0: ")
        if d["verdict"] == "waits":
            md += ["", what + f"**verdict waits** ({d['n']} of {d['pairs_required']} pairs in; a partial set is not read)."]
        else:
            md += ["", what + f"**{d['verdict']}**: {_paired_ci(d)} points."]
    return md


def _paired_ci(s: dict | None) -> str:
    if not s or s.get("mean") is None:
        return "–"
    return f"{_ci(s) if s['ci95'][0] is not None else format(100 * s['mean'], '+.1f')} ({s['n']})"


def _detectable(s: dict | None) -> str:
    return "–" if not s or s.get("detectable") is None else f"{100 * s['detectable']:.1f}"


def _dataset_table(summary: dict) -> list[str]:
    md = ["", "## Per data set", "", "| arm | model | " + " | ".join(summary["eval"]["data"]) + " |",
          "|---|---|" + "---:|" * len(summary["eval"]["data"])]
    for arm, per in summary["by_dataset"].items():
        for a in summary["models"]:
            md.append(f"| {arm} | {a} | " + " | ".join(_fmt(_mean(v), _std(v)) for v in per[a].values()) + " |")
    return md


def _exchange_section(summary: dict) -> list[str]:
    """Per exchanging arm: responses admitted / transferred, graded correct by their source, the peer rows'
    share of the update, the steps with an exchange; then the peer-token clip rates."""
    md = ["", "## Exchange", ""]
    for arm, ex in summary["exchanged"].items():
        tr = summary.get("transferred", {}).get(arm, {})
        md.append(f"- {arm}: admitted / transferred peer responses per seed " + "; ".join(
            f"{d}: " + ", ".join("–" if a is None else f"{a}/{t}" for a, t in zip(v, tr.get(d, [None] * len(v)), strict=True))
            for d, v in ex.items()))
        corr = summary.get("admitted_correct", {}).get(arm, {})
        if corr:
            md.append("  - admitted responses the source graded correct, per seed: " + "; ".join(
                f"{d}: " + ", ".join("–" if x is None else str(x) for x in v) for d, v in corr.items()))
        share = summary.get("peer_row_share", {}).get(arm, {})
        if any(x is not None for v in share.values() for x in v):
            md.append("  - peer rows' share of the update rows (mean over steps), per seed: " + "; ".join(
                f"{a}: " + ", ".join("–" if x is None else f"{100 * x:.2f} %" for x in v) for a, v in share.items()))
        for d, per_seed in summary.get("exchange_steps", {}).get(arm, {}).items():
            done = [x for x in per_seed if x]
            if done:
                md.append(f"  - {d}: steps with a balanced target m > 0: {[x['with_target'] for x in done]}, with an "
                          f"admitted response: {[x['with_admitted'] for x in done]} (of {done[0]['steps']}); median s of "
                          "the responses transferred in the first → last third of training: " + ", ".join(
                              f"{_num2(x['s_median_first_third'])} → {_num2(x['s_median_last_third'])}" for x in done))
    if summary["clip_frac_peer_by_model"]:
        md.append("- peer-token clip rate (low + high, mean over steps with peer data): " + "; ".join(
            f"{k}: " + ", ".join(f"{a} {'–' if v is None else f'{100 * v:.2f}%'}" for a, v in d.items())
            for k, d in summary["clip_frac_peer_by_model"].items()))
    return md


PLOTS = (("Training reward", "rewards"), ("Complementarity (independent GRPO runs)", "complementarity"),
         ("Compatibility s", "s_hist"), ("Exchange sizes", "exchange"), ("Clip rates", "clip_rates"))
"""The report's plots in order: title, key of :func:`_plots`."""


def _last_quarter_table(summary: dict) -> list[str]:
    """Per arm and model, the training statistics STUDY.md's selection rule reads: the mean over the finished seeds
    (their count in brackets; each seed's numbers are in summary.json ``last_quarter``)."""
    cells = [(arm, a, [q for q in qs if q]) for arm, per in summary.get("last_quarter", {}).items()
             for a, qs in per.items()]
    cells = [c for c in cells if c[2]]
    if not cells:
        return []
    md = ["", "## Last quarter of training", "",
          "| arm | model | steps | mean strict reward [seeds] | mean distinct_frac | rewarded echo / example copy |",
          "|---|---|---|---:|---:|---:|"]
    for arm, a, qs in cells:
        rewarded = sum(q["rewarded"] for q in qs)
        shares = [q["echo_or_copy_share"] for q in qs]
        flagged = None if None in shares else sum(x * q["rewarded"] for x, q in zip(shares, qs, strict=True))
        share = "–" if flagged is None else f"{100 * flagged / max(rewarded, 1):.0f} % of {rewarded}"
        distinct = [q["distinct_frac"] for q in qs]
        md.append(f"| {arm} | {a} | {qs[0]['steps'][0]}–{qs[0]['steps'][1]} | {_mean([q['reward'] for q in qs]):.3f} "
                  f"[{len(qs)}] | {_num2(None if None in distinct else _mean(distinct))} | {share} |")
    return md


def _one_step_section(summary: dict) -> list[str]:
    """The one-update paired test (``graft onestep``), when the plan names its summary."""
    if "one_step_effect" not in summary:
        return []
    md = ["", "## One update with vs without the peer groups (`graft onestep`)", "",
          "Difference in the receiver's success rate after one update, GRAFT's admitted peer groups minus its own "
          "groups only (gate off: `exchange.admission=all`), points, mean over prompts with a 95 % bootstrap interval "
          "over training states and prompts.", "",
          "| direction | prompts measured | GRAFT − GRPO | gate off − GRPO | prompts (states) | admitted (correct) |",
          "|---|---|---:|---:|---:|---:|"]
    for d, kinds in summary["one_step_effect"].items():
        t = summary["one_step_treatment"].get(d, {})
        for kind, s in kinds.items():
            off = summary["one_step_effect_gate_off"].get(d, {}).get(kind, {})
            md.append(f"| {d} | {kind} | {_ci(s)} | {_ci(off)} | {s['prompts']} ({s['states']}) | "
                      f"{t.get('admitted/graft', '–')} ({t.get('admitted_correct/graft', '–')}) |")
    md += _one_step_t_rows(summary)
    st = summary.get("one_step_states")
    if st:
        md += ["", f"Training states measured: {st['measured']}; {st['with_exchange']} had a prompt to exchange (in the "
                   "others no prompt was selected in either direction: GRAFT's update is GRPO's there)."]
    return md


def _one_step_t_rows(summary: dict) -> list[str]:
    """The Student-t interval over state means and the prompts that changed at all, for summaries that carry
    them (``graft onestep`` arms version 2); the verdict reads this interval (``one_step_verdict_interval``)."""
    rows = [(d, kind, s) for d, kinds in summary["one_step_effect"].items() for kind, s in kinds.items() if "t95" in s]
    if not rows:
        return []
    why = summary.get("one_step_verdict_interval", {}).get("why", "")
    md = ["", f"GRAFT − GRPO with a Student-t 95 % interval over state means (df = states − 1). {why}".rstrip(), "",
          "| direction | prompts measured | GRAFT − GRPO (t) | prompts changed at all | states |", "|---|---|---:|---:|---:|"]
    for d, kind, s in rows:
        md.append(f"| {d} | {kind} | {_ci(s['t95'])} | {s['differed']} of {s['prompts']} | {s['t95']['states']} |")
    return md


def _ci(s: dict) -> str:
    if not s or s.get("mean") is None:
        return "–"
    if None in s["ci95"]:
        return f"{100 * s['mean']:+.1f} (one state: no interval)"
    return f"{100 * s['mean']:+.1f} [{100 * s['ci95'][0]:+.1f}, {100 * s['ci95'][1]:+.1f}]"


def _plot_sections(plots: dict[str, str]) -> list[str]:
    md = []
    if plots:
        md += ["", "The plots below show one run per arm, its lowest seed (the stored-peer runs are left out); "
                   "every seed's numbers are in the tables above and in summary.json."]
    for title, key in PLOTS:
        if plots.get(key):
            md += ["", f"## {title}", "", f"![{title}]({plots[key]})"]
    return md


def _commands(plan: Plan) -> list[str]:
    return ["", "## Commands", "", "```", f"graft experiment run {plan_path_hint(plan)}",
            f"graft experiment summarize {plan_path_hint(plan)}", "```", "",
            "Each run's exact `graft train` / `graft eval` command is printed by `graft experiment run` before it "
            "starts; `results/.../runs/ARM/seedS/config.yaml` is the resolved config."]


def strict_section(plan: Plan, summary: dict) -> list[str]:
    """The eval responses re-graded with the strict rule, the reward monitor of the answers each run's own
    grading rewarded, and strict pass@1 per problem family beside its chance level."""
    A, strict = summary["models"], summary.get("arms_answer_form_number", {})
    if not any(x is not None for per in strict.values() for xs in per.values() for x in xs):
        return []
    skill = summary.get("arms_strict_skill", {})
    md = ["", "## Strict re-grade", "",
          "Every kept eval response re-graded with the strict rule (`reward.answer_form=number`: exactly one final "
          "answer, the reference in lowest terms — `\\boxed{192/4}` for 48, `\\boxed{27*18}` and "
          "`\\boxed{117} or \\boxed{228}` score 0). *Skill only* leaves out the families whose chance level — the "
          f"reward of boxing a number of the question — is at least {CHANCE_FAMILY:.0%} (`max`: 50 %). "
          "The plan's own grading is the table above.", "",
          "| arm | " + " | ".join(f"{a} strict | {a} skill only" for a in A) + " |", "|---|" + "---:|" * (2 * len(A))]
    for arm, per in strict.items():
        md.append(f"| {arm} | " + " | ".join(f"{_seed_cells(per[a])} | {_seed_cells(skill.get(arm, {}).get(a, []))}"
                                             for a in A) + " |")
    for a in A:
        xs = [x for x in summary.get("stored_answer_form_number", {}).get(a, []) if x is not None]
        if xs:
            md.append(f"| stored peer ({a} receives) | " + " | ".join(f"{_fmt(_mean(xs))} | " if b == a else " | "
                                                                     for b in A) + " |")
    strict_rows = _paired_rows(plan, summary, "_number")
    paired = (["", "Paired differences with the strict rule: the same as with the plan's own grading (below)."]
              if strict_rows and strict_rows == _paired_rows(plan, summary, "")
              else _paired_lines(plan, summary, "_number", ", strict"))
    return md + paired + _monitor_table(summary) + _family_table(summary)


def _monitor_table(summary: dict) -> list[str]:
    """Per arm and model, the shares of shortcut answers among those the run's own grading rewarded."""
    md = ["", "## Reward monitor", "",
          "Among the eval answers each run's own grading rewarded: the share that box an operator, a fraction, a "
          "number of the question, box twice, copy a worked example or echo the question (%, mean over seeds; "
          "*rewarded*: their count, summed over seeds). A share far above the honest runs' is a shortcut.", "",
          "| arm | model | rewarded | " + " | ".join(FLAGS) + " |", "|---|---|---:|" + "---:|" * len(FLAGS)]
    for arm, per in summary.get("monitor", {}).items():
        for a in summary["models"]:
            mons = [x["as_run"] for x in per.get(a, []) if x]
            if not mons:
                continue
            cells = [_fmt(_mean([x[f] for x in mons if x[f] is not None])) for f in FLAGS]
            md.append(f"| {arm} | {a} | {sum(x['n'] for x in mons)} | " + " | ".join(cells) + " |")
    return md


def _family_table(summary: dict) -> list[str]:
    """Strict pass@1 per problem family (mean over seeds, per arm and model) beside its chance level."""
    A, fams = summary["models"], summary.get("families", {})
    names = sorted({f for per in fams.values() for xs in per.values() for x in xs if x for f in x})
    if not names:
        return []
    md = ["", "Strict pass@1 (%) per problem family, mean over seeds (" + " / ".join(A) + "), and the family's "
          "chance level on the eval prompts:", "",
          "| family | chance | " + " | ".join(fams) + " |", "|---|---:|" + "---:|" * len(fams)]
    for f in names:
        chance = next((x[f]["chance"] for per in fams.values() for xs in per.values() for x in xs if x and f in x), None)
        cells = [" / ".join(_fmt(_mean([x[f]["pass@1"] for x in per.get(a, []) if x and f in x]) if any(
            x and f in x for x in per.get(a, [])) else None) for a in A) for per in fams.values()]
        md.append(f"| {f} | {_fmt(chance)} | " + " | ".join(cells) + " |")
    return md


def plan_path_hint(plan: Plan) -> str:
    return f"configs/experiments/{plan.name}.yaml"


def write_summary(plan: Plan) -> Path:
    """Write the plan's summary.json, plots and REPORT.md under its results folder."""
    summary = summarize(plan)
    plan.results.mkdir(parents=True, exist_ok=True)
    (plan.results / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (plan.results / "REPORT.md").write_text(report_markdown(plan, summary, _plots(plan)))
    return plan.results / "summary.json"


def _plots(plan: Plan) -> dict[str, str]:
    """The report's plots of each arm's lowest finished seed (stored-peer runs left out): key -> file name."""
    lowest = [m for m in plan.members if m.store is None and (m.results_dir / "metrics.jsonl").is_file()
              and m.seed == min(plan_seeds(plan, m.arm))]
    runs = [(m, compute_analysis(m.results_dir)) for m in lowest]
    if not runs:
        return {}
    named = [(m.arm, analysis) for m, analysis in runs]
    plots = {"rewards": rep.plot_rewards(named, plan.results), "s_hist": rep.plot_s_hist(named, plan.results),
             "exchange": rep.plot_exchange(named, plan.results), "clip_rates": rep.plot_clip_rates(named, plan.results)}
    alone = [(m.arm, analysis) for m, analysis in runs if not m.exchanges]
    if alone:
        plots["complementarity"] = rep.plot_complementarity(alone, plan.results)
    return plots


def plan_seeds(plan: Plan, arm: str) -> list[int]:
    return [m.seed for m in plan.members if m.arm == arm]


def experiment_main(argv: list[str]) -> int:
    args = experiment_parser().parse_args(argv)
    plan = load_plan(args.plan)
    check_only(plan, args.only)
    if args.action == "status":
        rows = plan_status(plan)
        width = max(len(f"{r['arm']}/seed{r['seed']}") for r in rows) if rows else 0
        for r in rows:
            print(f"{r['arm'] + '/seed' + str(r['seed']):<{width}}  {r['state']}")
        done = sum(r["state"] in ("done", "results only") for r in rows)
        print(f"[experiment {plan.name}] {done} of {len(rows)} runs finished; `graft experiment run` does the rest"
              if done < len(rows) else f"[experiment {plan.name}] all {len(rows)} runs finished")
        return 0
    if args.action == "print":
        for m in plan.members:
            print(shlex.join(m.command(plan.config)))
        return 0
    if args.action == "run":
        left = run_plan(plan, args.max_minutes, args.only)
        print(f"[experiment {plan.name}] {len(left)} run(s) left" if left else f"[experiment {plan.name}] all runs done",
              file=sys.stderr)
    path = write_summary(plan)
    print(f"summary: {path}; report: {plan.results / 'REPORT.md'}")
    return 0
