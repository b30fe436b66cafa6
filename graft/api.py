"""graft from Python, the way TRL users work: a config, your reward functions and your data in, a run out.

    import graft
    cfg = graft.load_config("default", overrides=["steps=20"])
    run = graft.train(cfg, reward_funcs=[correct, short], reward_weights=[1.0, 0.1], train_dataset=ds,
                      callbacks=[print_step])
    run.metrics[-1]["A/reward/mean"], run.summary["steps_done"]

:func:`train` is what ``graft train`` runs (the command is a thin layer over it): the same checks, the same run
folder, the same resume. A config built in Python (``graft.Config(models=[...], ...)``) is checked as a loaded one
(:func:`validate`: every error, one line each, naming the field). Reward functions are TRL's: called as
``f(prompts=[...], completions=[...], **columns)`` with every column of the rows under its own name, each returning
one float (or None) per completion; they run in a worker process, so a function defined in a script or a notebook
is sent to it by value (no ``if __name__ == "__main__":`` guard needed). A callback ``fn(step, metrics)`` is called
after every step; one that returns ``True`` (or raises :class:`StopTraining`) stops the run cleanly: the step is
checkpointed and ``train(cfg_with_resume_true)`` continues it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from graft.config import Config, ConfigError, load_config as _load_config
from graft.config.checks import member_values
from graft.config.coerce import build
from graft.errors import UserError
from graft.evaluation.samples import Sample, Source, run_threshold, store_samples
from graft.trainer import loop
from graft.trainer.loop import Callback
from graft.trainer.stop import StopTraining


@dataclasses.dataclass
class Run:
    """A run folder read back: its config, one metrics dict per step, its summary, and the files beside them."""

    run_dir: Path
    """The run folder (``cfg.run_dir``)."""
    metrics: list[dict]
    """One dict per step, as ``metrics.jsonl`` holds them (eval lines, which carry no ``step`` key, left out)."""
    summary: dict
    """``summary.json``: what the run did (steps, exchange, time, memory; empty before a run ends)."""

    def audit(self) -> list[dict]:
        """The exchange audit log (``audit.jsonl``): one record per step and direction."""
        return _jsonl(self.run_dir / "audit.jsonl")

    def config(self) -> dict:
        """The run's resolved config as it saved it (``config.yaml``)."""
        path = self.run_dir / "config.yaml"
        return yaml.safe_load(path.read_text()) if path.is_file() else {}

    def samples(
        self, source: Source = "train", model: str | None = None, steps: tuple[int, int] | None = None, reward: str = "any"
    ) -> list[Sample]:
        """The run's responses as ``graft samples`` reads them (its trajectory store): ``source`` ``train`` (written
        by ``model``; None: any) or ``peer`` (admitted by ``model``), ``steps`` a ``(first, last)`` range, ``reward``
        ``any``, ``1`` (rewarded) or ``0``. Each :class:`graft.evaluation.samples.Sample` has the writer, step,
        prompt id and text, response, reward and verifier status."""
        return store_samples(self.run_dir, source, model, steps, reward, run_threshold(self.run_dir))


def load_config(source: str | Path = "default", overrides: Sequence[str] = ()) -> Config:
    """A config from a file or a packaged preset's name (``default``, ``baselines/grpo_n8``), with ``key=value``
    overrides (:func:`graft.config.load_config`)."""
    return _load_config(source, list(overrides))


def validate(cfg: Config) -> Config:
    """``cfg`` (built or changed in Python) checked exactly as a loaded config is: every field against its type and
    every invariant, all errors at once (:class:`graft.config.ConfigError`, one line each). Returns a new config."""
    return build(Config, _tree(cfg), "")


def _tree(value: Any) -> Any:
    """A config as the nested mappings a file gives, Python objects (functions, datasets) kept as they are."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _tree(v) for k, v in member_values(value).items()}
    if isinstance(value, list) and value and all(dataclasses.is_dataclass(v) for v in value):
        return [_tree(v) for v in value]
    if isinstance(value, dict):
        return {k: _tree(v) for k, v in value.items()}
    return value


def train(
    cfg: Config | str | Path,
    *,
    reward_funcs: Sequence[Callable | str] | None = None,
    reward_weights: Sequence[float] | None = None,
    train_dataset: Any = None,
    eval_dataset: Any = None,
    callbacks: Sequence[Callback] = (),
) -> Run:
    """Train (or resume, with ``resume: true``) the run ``cfg`` describes; returns it read back (:class:`Run`).

    ``reward_funcs``/``reward_weights`` set ``reward.function``/``reward.weights``; ``train_dataset``/``eval_dataset``
    set ``data.train``/``data.val`` (a ``datasets.Dataset``, a pandas ``DataFrame``, a list of dicts, or a file
    name). Raises :class:`graft.config.ConfigError` for a config that cannot run, ``graft.trainer.stop.Preempted``
    after SIGTERM/SIGINT/SIGHUP (the finished steps checkpointed) and ``Diverged`` when updates stay non-finite."""
    if not isinstance(cfg, Config):
        cfg = load_config(cfg)
    tree = _tree(cfg)
    given = {
        ("reward", "function"): list(reward_funcs) if reward_funcs is not None else None,
        ("reward", "weights"): list(reward_weights) if reward_weights is not None else None,
        ("data", "train"): train_dataset,
        ("data", "val"): eval_dataset,
    }
    for (section, key), value in given.items():
        if value is not None:
            tree[section][key] = value
    checked = build(Config, tree, "")
    loop.train(checked, callbacks)
    return load_run(checked.run_dir)


def load_run(path: str | Path) -> Run:
    """A run folder read back (:class:`Run`): its metrics, summary, and the audit log, samples and config on demand."""
    run_dir = Path(path)
    if not (run_dir / "metrics.jsonl").is_file() and not (run_dir / "config.yaml").is_file():
        raise UserError(f"{run_dir}: not a graft run folder (no metrics.jsonl or config.yaml)")
    metrics = [m for m in _jsonl(run_dir / "metrics.jsonl") if "step" in m]
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    return Run(run_dir=run_dir, metrics=metrics, summary=summary)


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


__all__ = ["Callback", "Config", "ConfigError", "Run", "StopTraining", "load_config", "load_run", "train", "validate"]
