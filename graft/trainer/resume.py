"""How a run starts: fresh, or from a checkpoint, and what a resume may change.

A run's identity is its config (less the fields of :data:`RESUMABLE_CHANGES`), its training data (the checkpoint's
``data_fingerprint``, checked by the sampler), the code of its reward (``reward_code``: the sha256 of every reward
function's and user domain's module file, :func:`graft.domains.grading.reward_code`) and the horizon of each model's
learning-rate schedule (``lr_horizon``). ``resume=true`` continues a run only when all of that is unchanged, and
only when the run folder still holds the history the checkpoint was saved after (``history``: the rows of
``metrics.jsonl`` and ``audit.jsonl`` and the trajectory store's step files up to its step). What it does accept --
the fields that only bound waiting, decide what to do on an error or set how the work is spread, a new horizon set
explicitly, new reward code with ``reward.accept_code_change`` -- is written to ``changes.jsonl`` with the step it
takes effect after. Without ``resume``, a folder that holds any of a run's outputs is refused.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graft.config import Config, ConfigError, config_diff, to_dict, upgrade_tree
from graft.console import say
from graft.files import dumps_json
from graft.policy.loading import ModelLoadError, load_tokenizer
from graft.storage.checkpoint import (
    Checkpoint,
    CheckpointError,
    checkpoint_step,
    list_checkpoints,
    load_checkpoint,
    newest_intact_checkpoint,
    restore_tokenizer_files,
)
from graft.storage.trajectory_store import StoreError, TrajectoryStore
from graft.trainer.metrics import JsonlWriter

RESUMABLE_CHANGES = (
    "resume",
    "steps",
    "progress",
    "threads*",
    "device",
    "run_dir",
    "checkpoint.*",
    "eval.*",
    "reward.workers",
    "reward.timeout_s",
    "reward.function_timeout_s",
    "reward.function_memory_mb",
    "reward.max_timeout_frac",
    "reward.on_error",
    "reward.accept_code_change",
    "rollout.batch_size",
    "update.micro_batch_size",
    "update.logprob_chunk",
    "update.max_nonfinite_steps",
    "ray.*",
    "backend",
    "logging*",
    "models.*.lr_horizon",
)
"""Config fields (``fnmatch`` patterns of dotted keys) that may change between a run and its resumption: how the
work is spread and shown, how long to wait for a grader and what to do on its error, the number of steps (a
decaying learning-rate schedule keeps its recorded horizon: :func:`lr_horizons`) and an explicit new horizon. Each
accepted change is recorded in ``changes.jsonl``."""

RUN_OUTPUTS = (
    "metrics.jsonl",
    "audit.jsonl",
    "summary.json",
    "changes.jsonl",
    "trajectories",
    "eval",
    "checkpoints",
    "tensorboard",
    "wandb/graft_run_id",
    "mlruns",
)
"""A run's outputs in its folder: any of them makes the folder a run's (never a fresh start without ``resume``);
``resume=restart`` deletes them (config.yaml is rewritten; W&B's own files stay)."""

CHANGES = "changes.jsonl"
"""The run folder's record of what each resume changed (one line per resume that changed anything)."""


@dataclass
class Start:
    """How a run starts (:func:`start_of`)."""

    ckpt: Checkpoint | None
    """The checkpoint it continues from (fully verified), or None for a fresh start."""
    reward_code: dict[str, str]
    """The sha256 of the reward's own code (:func:`graft.domains.grading.reward_code`), saved with every checkpoint."""
    lr_horizon: dict[str, int]
    """Per model, the steps its learning-rate schedule spans (recorded at the start, saved with every checkpoint)."""
    changes: dict[str, Any] = field(default_factory=dict)
    """What this resume accepts that differs from the checkpoint (``changes.jsonl``'s record); empty when fresh."""


def start_of(cfg: Config, run_dir: Path, reward_code: dict[str, str]) -> Start:
    """The checkpoint to resume from, checked against the run's identity and its folder's history, and what the
    resume changes; or a fresh start. Refusals are one-line :class:`~graft.config.ConfigError` s (and
    :class:`~graft.storage.checkpoint.CheckpointError` / :class:`~graft.storage.trajectory_store.StoreError`)."""
    ckpt = _find_resume(cfg, run_dir)
    fresh = {m.name: m.lr_horizon or cfg.steps for m in cfg.models}
    if ckpt is None:
        return Start(None, reward_code, fresh)
    saved = json.loads(json.dumps(ckpt.config))
    upgrade_tree(saved)  # a checkpoint of an earlier version: its keys as they are called now
    now = to_dict(cfg)
    fields = _field_changes(ckpt, saved, now)
    horizons = lr_horizons(cfg, ckpt, saved, "steps" in fields)
    code = _code_changes(cfg, ckpt, reward_code)
    check_history(run_dir, ckpt)
    changes: dict[str, Any] = {"fields": fields} if fields else {}
    before = ckpt.state.get("lr_horizon") or {}
    moved = {n: {"from": before.get(n), "to": h} for n, h in horizons.items() if before.get(n) not in (None, h)}
    changes |= {"lr_horizon": moved} if moved else {}
    changes |= {"reward_code": code} if code else {}
    return Start(ckpt, reward_code, horizons, changes)


def _field_changes(ckpt: Checkpoint, saved: dict, now: dict) -> dict[str, dict]:
    """``{field: {"from", "to"}}`` of the resumable fields that differ (``resume`` aside); any other difference is
    refused, naming every such field."""
    diff = config_diff(saved, now)
    refused = [k for k in diff if not any(fnmatch.fnmatchcase(k, p) for p in RESUMABLE_CHANGES)]
    if refused:
        raise ConfigError(
            f"cannot resume from {ckpt.path}: these config fields differ from the checkpoint: "
            + ", ".join(f"{k} ({_short(_value(saved, k))} -> {_short(_value(now, k))})" for k in refused)
        )
    return {k: {"from": _value(saved, k), "to": _value(now, k)} for k in diff if k != "resume"}


def _short(value: Any) -> str:
    """A value as a refusal shows it: its repr, cut at 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _value(tree: Any, key: str) -> Any:
    """The value at dotted ``key`` (list items by index: ``models.0.lr``) of a config tree, or None."""
    for part in key.split("."):
        if isinstance(tree, dict):
            tree = tree.get(part)
        elif isinstance(tree, list) and part.isdigit() and int(part) < len(tree):
            tree = tree[int(part)]
        else:
            return None
    return tree


def lr_horizons(cfg: Config, ckpt: Checkpoint, saved: dict, steps_changed: bool) -> dict[str, int]:
    """Per model, the horizon of its learning-rate schedule from the checkpoint on: ``models.I.lr_horizon`` when set,
    else the one the run recorded at its start (a checkpoint of an earlier version: its ``steps``). A changed
    ``steps`` with a decaying schedule (``linear``, ``cosine``) and no horizon set is refused: its rate from the
    next step on would follow neither the old plan nor a new one."""
    recorded = ckpt.state.get("lr_horizon") or {}
    out = {}
    for i, m in enumerate(cfg.models):
        before = int(recorded.get(m.name, saved.get("steps") or cfg.steps))
        if steps_changed and m.lr_schedule != "constant" and m.lr_horizon is None:
            raise ConfigError(
                f"cannot resume from {ckpt.path} with steps={cfg.steps}: models.{i}.lr_schedule={m.lr_schedule} decays "
                f"over the {before} steps the run planned, so its rate from step {ckpt.step + 1} on would follow "
                f"neither plan; set models.{i}.lr_horizon={before} to keep the schedule or ={cfg.steps} to stretch it "
                f"from step {ckpt.step + 1} on (recorded in {CHANGES})"
            )
        out[m.name] = m.lr_horizon or before
    return out


def _code_changes(cfg: Config, ckpt: Checkpoint, now: dict[str, str]) -> dict[str, dict]:
    """``{key: {"from", "to"}}`` of the reward code that differs from the checkpoint's; refused (naming the first)
    unless ``reward.accept_code_change``. A checkpoint of an earlier version recorded none: nothing to compare."""
    saved = ckpt.state.get("reward_code")
    if saved is None:
        return {}
    changed = {k: {"from": saved.get(k), "to": now.get(k)} for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)}
    if changed and not cfg.reward.accept_code_change:
        key, d = next(iter(changed.items()))
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise ConfigError(
            f"cannot resume from {ckpt.path}: the code of {key} changed since it was saved (sha256 "
            f"{str(d['from'])[:12]} -> {str(d['to'])[:12]}){more}; resume with the code the run was trained with, or "
            f"pass reward.accept_code_change=true to go on with the new code (recorded in {CHANGES})"
        )
    return changed


def history(run_dir: Path, step: int) -> dict[str, int]:
    """What a checkpoint of ``step`` records of the run folder's history: rows of ``metrics.jsonl`` and
    ``audit.jsonl``, step files of the trajectory store, up to ``step`` (all written before the checkpoint)."""
    return {
        "metrics": len(_rows_upto(run_dir / "metrics.jsonl", step)),
        "audit": len(_rows_upto(run_dir / "audit.jsonl", step)),
        "trajectories": len([s for s in TrajectoryStore(run_dir / "trajectories").steps() if s <= step]),
    }


def _rows_upto(path: Path, step: int) -> list[dict]:
    return [r for r in JsonlWriter(path).read() if isinstance(r.get("step"), int) and r["step"] <= step]


def check_history(run_dir: Path, ckpt: Checkpoint) -> None:
    """The run folder holds every record the checkpoint was saved after (its ``history``; older checkpoints
    recorded none), or a one-line :class:`~graft.config.ConfigError` naming the file: resuming would otherwise
    write a history with a hole (a deleted ``metrics.jsonl``: a summary of the last steps only). A checkpoint
    outside ``run_dir`` (``resume=PATH`` of another run) has no history here to check."""
    saved = ckpt.state.get("history")
    if not saved or ckpt.path.resolve().parent.parent != run_dir.resolve():
        return
    have = history(run_dir, ckpt.step)
    what = {"metrics": "rows of metrics.jsonl", "audit": "records of audit.jsonl", "trajectories": "step files of trajectories/"}
    for key, n in saved.items():
        if have.get(key, 0) < n:
            raise ConfigError(
                f"cannot resume from {ckpt.path}: {run_dir} holds {have[key]} of the {n} {what[key]} written up to "
                f"step {ckpt.step} (deleted or replaced?); the resumed run's history would have a hole; put them back, "
                "or start over with resume=restart (or another run_dir)"
            )


def has_history(run_dir: Path) -> list[str]:
    """The run outputs ``run_dir`` holds (non-empty files and folders of :data:`RUN_OUTPUTS`)."""
    found = []
    for name in RUN_OUTPUTS:
        p = run_dir / name
        if (p.is_file() and p.stat().st_size > 0) or (p.is_dir() and any(p.iterdir())):
            found.append(name)
    return found


def record_changes(run_dir: Path, ckpt: Checkpoint, changes: dict[str, Any]) -> None:
    """Append what a resume changed to ``changes.jsonl``: the step it takes effect after, the checkpoint, the time."""
    if changes:
        JsonlWriter(run_dir / CHANGES).write(
            {"step": ckpt.step, "checkpoint": str(ckpt.path), "time": time.strftime("%Y-%m-%d %H:%M:%S"), **changes}
        )


def _find_resume(cfg: Config, run_dir: Path) -> Checkpoint | None:
    """The checkpoint to resume from (fully verified), or None for a fresh start. Never deletes an
    earlier run's history unless asked to (``resume=restart``)."""
    if cfg.resume is False or cfg.resume is None:
        found = has_history(run_dir)
        if found:
            raise ConfigError(
                f"run_dir: {run_dir} already holds a run ({', '.join(found)}); pass resume=true to continue it, "
                "resume=restart to discard it, or choose another run_dir"
            )
        return None
    if cfg.resume == "restart":
        _discard_run(run_dir)
        return None
    if cfg.resume is True:
        _restore_tokenizers(cfg, run_dir)
        ckpt, warnings = newest_intact_checkpoint(run_dir)  # a damaged newest one is skipped, with a warning
        for w in warnings:
            say(w)
        if ckpt is None:  # killed before (or during) its first save: a requeue loop must still get going
            aside = _set_aside(run_dir)
            moved = f"moved the earlier attempt's files to {aside}; " if aside else ""
            say(f"resume: no intact checkpoint in {run_dir}; {moved}starting from scratch")
            return None
    else:
        ckpt = load_checkpoint(Path(str(cfg.resume)), verify="full")
    _check_optimizer_state(cfg, run_dir, ckpt)
    return _check_store(cfg, run_dir, ckpt)


def _check_optimizer_state(cfg: Config, run_dir: Path, ckpt: Checkpoint) -> None:
    path = ckpt.path
    missing = [m.name for m in cfg.models if m.name not in ckpt.optimizer_names]
    if missing and (ckpt.config.get("checkpoint") or {}).get("keep_optimizer") == "none":
        raise ConfigError(
            f"cannot resume from {path}: it holds weights only (the run was saved with "
            "checkpoint.keep_optimizer=none, no optimizer state); to continue from these weights, export "
            f"them (graft export {run_dir} --step {ckpt.step} --model NAME OUT) and train a new run_dir "
            "with models.I.path=OUT"
        )
    if missing:
        names = {m.name for m in cfg.models}
        with_opt = (
            [p for p in list_checkpoints(run_dir) if names <= set(load_checkpoint(p).optimizer_names)] if run_dir.is_dir() else []
        )
        hint = (
            f"resume from {with_opt[-1]} (resume={with_opt[-1]}), which has it"
            if with_opt
            else f"to start a new run from these weights, export them (graft export {run_dir} --step {ckpt.step} "
            "--model NAME OUT) and train a new run_dir with models.I.path=OUT"
        )
        raise ConfigError(
            f"cannot resume from {path}: it holds no optimizer state for model(s) {', '.join(missing)} "
            f"(checkpoint.keep_optimizer=last keeps it only in the newest checkpoint); {hint}"
        )


def _restore_tokenizers(cfg: Config, run_dir: Path) -> None:
    """A damaged tokenizer file is one inode shared by every checkpoint (hard links): rewrite it from the model's
    own tokenizer where that has the recorded sha256, one line each, before the checkpoints are verified."""
    with tempfile.TemporaryDirectory() as tmp:
        for line in restore_tokenizer_files(run_dir, lambda name: _saved_tokenizer(cfg, name, Path(tmp))):
            say(line)


def _saved_tokenizer(cfg: Config, name: str, tmp: Path) -> Path | None:
    """Model ``name``'s tokenizer loaded from its configured source and saved into ``tmp/name``, as a run saves it."""
    m = next((m for m in cfg.models if m.name == name), None)
    if m is None:
        return None
    try:
        load_tokenizer(m).save_pretrained(str(tmp / name))
    except (ModelLoadError, OSError):
        return None
    return tmp / name


def _check_store(cfg: Config, run_dir: Path, ckpt: Checkpoint) -> Checkpoint:
    """``ckpt``, unless a trajectory store file at or before its step is torn. A resume re-runs only later steps, so
    with ``resume=true`` the newest resumable checkpoint before that step is used instead (it re-runs the step and
    rewrites the file; one warning line); with none, or with ``resume=PATH``, a :class:`StoreError` naming the file."""
    torn = TrajectoryStore(run_dir / "trajectories").first_torn(ckpt.step)
    if torn is None:
        return ckpt
    step, why = torn
    earlier = _earlier_resumable(cfg, run_dir, step) if cfg.resume is True else None
    if earlier is None:
        raise StoreError(
            f"{why}; resuming from step {ckpt.step} re-runs only later steps and no resumable checkpoint "
            f"precedes step {step}, so the file cannot be rewritten; nothing was changed; move it aside to "
            f"continue without step {step}'s trajectories, or start over with resume=restart"
        )
    say(f"warning: {why}; resuming from {earlier.path} instead, which re-runs step {step} and rewrites it")
    return earlier


def _earlier_resumable(cfg: Config, run_dir: Path, before: int) -> Checkpoint | None:
    """The newest intact checkpoint of ``run_dir`` before step ``before`` with every model's optimizer state, or None."""
    names = {m.name for m in cfg.models}
    for p in reversed(list_checkpoints(run_dir)):
        if checkpoint_step(p) >= before:
            continue
        try:
            ck = load_checkpoint(p, verify="full")
        except CheckpointError:
            continue
        if names <= set(ck.optimizer_names):
            return ck
    return None


def _set_aside(run_dir: Path) -> Path | None:
    """Move the run outputs in ``run_dir`` to a new ``run_dir/set_aside/attempt_K`` (nothing deleted);
    returns that folder, or ``None`` when there was nothing to move."""
    present = [name for name in RUN_OUTPUTS if (run_dir / name).exists()]
    if not present:
        return None
    k = 1
    while (run_dir / "set_aside" / f"attempt_{k}").exists():
        k += 1
    aside = run_dir / "set_aside" / f"attempt_{k}"
    for name in present:
        (aside / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).rename(aside / name)
    return aside


def _discard_run(run_dir: Path) -> None:
    gone = []
    for name in RUN_OUTPUTS:
        p = run_dir / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
        else:
            continue
        gone.append(name)
    if gone:
        say(f"resume=restart: deleted {', '.join(gone)} from {run_dir}; starting from scratch")


def describe_changes(changes: dict[str, Any]) -> str:
    """One line of what a resume changed, for stderr (the full record is in ``changes.jsonl``)."""
    parts = [f"{k} {dumps_json(v['from'])} -> {dumps_json(v['to'])}" for k, v in changes.get("fields", {}).items()]
    parts += [f"models {n}'s lr_horizon {v['from']} -> {v['to']}" for n, v in changes.get("lr_horizon", {}).items()]
    parts += [f"the code of {k}" for k in changes.get("reward_code", {})]
    return "; ".join(parts)
