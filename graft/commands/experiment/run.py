"""``graft experiment run`` and ``status``: each run of a plan trained (``graft train``), its final checkpoint evaluated
(``graft eval``) and analysed, its small files copied under ``results/``; runs claimed so that several processes share
a plan; where each run stands."""

from __future__ import annotations

import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

from graft.commands.experiment.plan import (  # load_plan re-exported: `run.load_plan`
    Member,
    Plan,
    base_member,
    check_unchanged,
    load_plan as load_plan,
)
from graft.config import ConfigError, EvalConfig, load_config, save_config
from graft.console import say
from graft.errors import UserError
from graft.evaluation.analyze import analyze, summary_text
from graft.signals import StopSignal, run_command
from graft.storage.checkpoint import checkpoint_step, latest_checkpoint
from graft.storage.lock import FolderLock, LockError, holder
from graft.trainer.stop import PREEMPTED_EXIT, Preempted

SMALL_FILES = ("config.yaml", "metrics.jsonl", "audit.jsonl", "summary.json", "analysis.json", "analyze.txt")


def _finished_in(folder: Path, eval_dir: str, models: list[str]) -> bool:
    return (folder / "summary.json").is_file() and all((folder / eval_dir / name / "results.json").is_file() for name in models)


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
            raise RunFailed(
                f"{m.run_dir}: trained, but no checkpoint is left to evaluate (checkpoint.save_final "
                "is off, or its checkpoints were removed)"
            )
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
    cmd = [
        sys.executable,
        "-m",
        "graft.cli",
        "eval",
        "--model",
        model,
        "--config",
        str(config),
        "--model-name",
        name,
        "--out",
        str(out),
        "--no-progress",
        "--n",
        str(plan.eval.get("n", EvalConfig.n)),
        "--repeats",
        str(plan.eval.get("repeats", EvalConfig.repeats)),
        "--temperature",
        str(plan.eval.get("temperature", EvalConfig.temperature)),
        "--top-p",
        str(plan.eval.get("top_p", EvalConfig.top_p)),
        "--seed",
        str(plan.eval.get("seed", 0)),
    ]
    for dname, dpath in plan.eval["data"].items():
        cmd += ["--data", f"{dname}={dpath}"]
    return cmd


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
    """Run one command of the plan (``what``: the run or model it works on, for its error line) under the stop
    protocol (:func:`graft.signals.run_command`: the signals this process gets reach it once, and it stops when this
    process dies); it stopping on a signal (its exit status ``PREEMPTED_EXIT``, or killed by one before its handler
    was in place) stops the plan, resumably; any other failure stops it with one line."""
    rc = run_command(cmd)
    if rc == PREEMPTED_EXIT:
        raise Preempted(
            f"graft {cmd[3]} stopped on a signal after checkpointing; continue with `graft experiment run` on the same plan"
        )
    if rc < 0:
        raise Preempted(
            f"graft {cmd[3]} was killed by {signal.Signals(-rc).name} before it could checkpoint; continue "
            "with `graft experiment run` on the same plan (the run resumes from its last checkpoint)"
        )
    if rc:
        raise RunFailed(
            f"`graft {cmd[3]}` of {what} failed with exit status {rc} (its error is above); fix it and "
            "run `graft experiment run` on the same plan again: finished runs are kept"
        )


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
        for graded in src.glob("*/repeat_*.jsonl"):  # the graded responses (~100 kB a set): every grade can be re-checked
            (m.results_dir / "eval" / name / graded.parent.name).mkdir(parents=True, exist_ok=True)
            shutil.copy2(graded, m.results_dir / "eval" / name / graded.parent.name / graded.name)


def run_plan(plan: Plan, max_minutes: float | None = None, only: list[str] | None = None) -> list[Member]:
    """Run every unfinished member (of ``only`` arms), in plan order; returns the members still unfinished.

    Each run (and the base evaluation) is claimed while it is worked on (a lock under ``RUNS/.claims``), so
    ``experiment run`` started several times on the same plan -- once per core with ``threads=1``, or on
    machines sharing the folder -- works through it together: each takes the next unclaimed run and skips
    the ones another holds. A stop signal (SIGTERM, SIGINT, SIGHUP) reaches the current command once
    (:func:`graft.signals.run_command`): a ``graft train`` checkpoints and stops, and so does the plan (exit 75)."""
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
    log = lambda s: say(f"[experiment {plan.name}] {s}")  # noqa: E731
    check_unchanged(plan)  # an edited plan trains nothing more
    todo = [m for m in plan.members if only is None or m.arm in only]
    if plan.base and (only is None or "base" in only):
        if (held := claim(plan, "base")) is None:
            log("skip the base evaluation: another `experiment run` of this plan holds it")
        else:
            with held:
                evaluate_base(plan, log)
    for m in todo:
        if stop.requested:
            raise Preempted(
                f"{stop.requested}: stopped after the current run; continue with `graft experiment run` on the same plan"
            )
        if _done(m):
            write_analysis(m)
            copy_small_files(m)
            continue
        if _recorded(m):
            log(f"skip {m.arm}/seed{m.seed}: its results are recorded in {m.results_dir} (move them away to run it again)")
            continue
        if m.store is not None and not (m.store.parent / "summary.json").is_file():
            log(
                f"skip {m.arm}/seed{m.seed}: its peer's trajectory store ({m.store}) is not here; "
                "its run has not finished on this machine"
            )
            continue
        if max_minutes is not None and (time.monotonic() - t0) / 60 > max_minutes:
            log(f"stopping after {max_minutes:g} minutes; rerun the same command to continue")
            break
        if (held := claim(plan, f"{m.arm}/seed{m.seed}")) is None:
            log(f"skip {m.arm}/seed{m.seed}: another `experiment run` of this plan holds it")
            continue
        with held:
            if _done(m) or _recorded(m):  # another process finished it between the checks above and the claim
                log(f"skip {m.arm}/seed{m.seed}: another `experiment run` of this plan finished it")
                continue
            log(f"{m.arm} seed {m.seed}: {m.run_dir}")
            run_member(plan, m, log)
    return [m for m in todo if not (_done(m) or _recorded(m))]


def member_state(m: Member, steps: int) -> str:
    """Where one run of the plan stands: ``done``, ``trained (eval pending)``, ``step k/steps
    (resumes from checkpoint c)``, ``step k/steps, training (pid N on HOST ...)`` (a ``graft train`` holds its
    folder), ``results only`` (its small files are here, its run folder is
    not: another machine ran it) or ``not started``."""
    if _done(m):
        return "done"
    if (m.run_dir / "summary.json").is_file():
        return "trained (eval pending)"
    if (m.run_dir / "metrics.jsonl").is_file():
        k = sum(1 for line in (m.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip())
        if (who := holder(m.run_dir)) is not None:  # a graft train holds the folder (e.g. one its plan left running)
            return f"step {k}/{steps}, training ({who})"
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
