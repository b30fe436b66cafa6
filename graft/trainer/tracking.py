"""Experiment trackers (``logging.report_to``): TensorBoard and Weights & Biases.

The training loop calls three things and nothing else::

    check_installed(cfg.logging)                 # in setup(), before any model loads
    tracker = open_trackers(run_dir, cfg, start_step)
    tracker.log(step, metrics)                   # after each metrics.jsonl line
    tracker.close()

What is logged, per step and at that step index: every key of the step's ``metrics.jsonl``
record that holds a number there (``step`` itself is the x axis; NaN/inf, written as ``null``
in ``metrics.jsonl``, and ``None`` are left out), so in-training evaluation
(``eval/M/val/pass@1``, ``eval/M/best_step``) arrives the same way. The resolved config is
logged once per (re)start: TensorBoard gets it as YAML text (tag ``config``, at step
``start_step - 1``) and, on a fresh run, as hparams (dotted keys, lists and ``None`` as text);
W&B gets it as the run config.

Files: TensorBoard writes ``RUN_DIR/tensorboard/events.out.tfevents.*``
(``tensorboard --logdir RUN_DIR/tensorboard``, or ``--logdir runs`` to compare runs); W&B
writes ``RUN_DIR/wandb/`` and keeps its run id in ``RUN_DIR/wandb/graft_run_id`` so that a
resumed run continues the same W&B run.

Resume. A resumed run restarts at the checkpoint's step + 1, possibly re-running steps that
the killed process had already logged. TensorBoard: the writer is opened with
``purge_step=start_step``, so TensorBoard hides every earlier event at a step >= start_step and
each step appears once. W&B (online): the same run id is resumed and W&B ignores a step it has
already received (the first value is kept; a resumed graft run recomputes those steps
identically except for timings). W&B offline: each (re)start is a folder
``RUN_DIR/wandb/offline-run-*-ID`` with the same id; ``wandb sync RUN_DIR/wandb/offline-run-*``
uploads them in order into one run.

W&B without network: ``logging.wandb_mode: auto`` (default) uses ``WANDB_MODE`` when set, else
``online`` when an API key is configured (``WANDB_API_KEY``, or a ``~/.netrc`` entry written by
``wandb login``) and ``offline`` otherwise; ``offline`` needs no network and no account.
"""
from __future__ import annotations

import importlib.util
import math
import netrc
import os
import secrets
import sys
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlparse

import yaml

from graft.config import Config, ConfigError, LoggingConfig, to_dict

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}
"""Tracker name -> the Python package it needs."""


def check_installed(logging_cfg: LoggingConfig) -> None:
    """Raise a one-line :class:`ConfigError` naming the package and the pip command when a
    requested tracker's package is missing (called before models load)."""
    for name in logging_cfg.report_to:
        pkg = PACKAGES[name]
        if importlib.util.find_spec(pkg) is None:
            raise ConfigError(f"logging.report_to includes {name}, but the {pkg!r} package is not installed: "
                              f"pip install {pkg}  (or pip install 'graft[trackers]')")


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The values of a metrics record that ``metrics.jsonl`` stores as numbers (``step`` excluded)."""
    out = {}
    for k, v in metrics.items():
        if k == "step" or v is None or isinstance(v, str) or not isinstance(v, (int, float)):
            continue
        if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
            continue
        out[k] = v
    return out


def flat_config(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a config dict; numbers, strings and bools kept, anything else as its YAML text."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out |= flat_config(v, key + ".")
        elif isinstance(v, (bool, int, float, str)):
            out[key] = v
        else:
            out[key] = yaml.safe_dump(v, default_flow_style=True).strip()
    return out


def has_wandb_credentials(env: Mapping[str, str] | None = None) -> bool:
    """True when a W&B API key is configured: ``WANDB_API_KEY``, or a netrc entry for the W&B host
    (what ``wandb login`` writes). Looks at no network."""
    env = os.environ if env is None else env
    if env.get("WANDB_API_KEY"):
        return True
    host = urlparse(env.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    path = env.get("NETRC") or str(Path.home() / ".netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode(setting: str, env: Mapping[str, str] | None = None) -> str:
    """The W&B mode to run in: ``setting`` unless ``auto`` (see the module doc)."""
    env = os.environ if env is None else env
    if setting != "auto":
        return setting
    if env.get("WANDB_MODE"):
        return env["WANDB_MODE"]
    return "online" if has_wandb_credentials(env) else "offline"


class _TensorBoard:
    def __init__(self, run_dir: Path, cfg: Config, start_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.dir = run_dir / "tensorboard"
        # purge_step: TensorBoard drops earlier events at steps >= start_step (steps re-run after a resume)
        self.writer = SummaryWriter(str(self.dir), purge_step=start_step if start_step > 1 else None)
        tree = to_dict(cfg)
        text = yaml.safe_dump(tree, sort_keys=False)
        self.writer.add_text("config", "".join("    " + line + "\n" for line in text.splitlines()), start_step - 1)
        if start_step == 1:
            metric_keys = {f"{m.name}/reward/mean": 0.0 for m in cfg.models}
            for part in hparams(flat_config(tree), metric_keys):
                self.writer.file_writer.add_summary(part)
        self.writer.flush()

    def log(self, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()   # a killed run keeps every logged step

    def close(self) -> None:
        self.writer.close()


class _Wandb:
    def __init__(self, run_dir: Path, cfg: Config, start_step: int) -> None:
        import wandb

        mode = wandb_mode(cfg.logging.wandb_mode)
        wdir = run_dir / "wandb"
        wdir.mkdir(parents=True, exist_ok=True)
        id_file = wdir / "graft_run_id"
        if start_step > 1 and id_file.is_file():
            run_id = id_file.read_text().strip()
        else:
            run_id = secrets.token_hex(4)   # W&B ids: lowercase letters and digits
            id_file.write_text(run_id + "\n")
        if mode == "offline" and cfg.logging.wandb_mode == "auto" and not os.environ.get("WANDB_MODE"):
            print(f"logging: no W&B API key configured; W&B logs offline to {wdir} "
                  f"(upload later: wandb sync {wdir}/offline-run-*)", file=sys.stderr)
        try:
            self.run = wandb.init(project=cfg.logging.wandb_project, name=run_dir.name, id=run_id, resume="allow",
                                  dir=str(run_dir), mode=mode, config=to_dict(cfg),
                                  settings=wandb.Settings(console="off"))
        except Exception as e:  # noqa: BLE001 - any failure to start is reported as one line
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"logging.report_to wandb: could not start a W&B run ({type(e).__name__}: {first}); "
                              "set logging.wandb_mode=offline to log without network") from None

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


_BACKENDS = {"tensorboard": _TensorBoard, "wandb": _Wandb}


class Trackers:
    """The open trackers of a run (possibly none): ``log(step, metrics)``, ``close()``."""

    def __init__(self, backends: list) -> None:
        self.backends = backends

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        values = scalars(metrics)
        for b in self.backends:
            b.log(step, values)

    def close(self) -> None:
        for b in self.backends:
            try:
                b.close()
            except Exception as e:  # noqa: BLE001 - closing a tracker must not hide the run's own error
                print(f"logging: closing {type(b).__name__.strip('_').lower()} failed: {e}", file=sys.stderr)
        self.backends = []


def open_trackers(run_dir: str | Path, cfg: Config, start_step: int = 1) -> Trackers:
    """Open every tracker of ``cfg.logging.report_to`` for a run that starts (or resumes) at ``start_step``."""
    check_installed(cfg.logging)
    opened: list = []
    try:
        for name in cfg.logging.report_to:
            opened.append(_BACKENDS[name](Path(run_dir), cfg, start_step))
    except BaseException:
        Trackers(opened).close()
        raise
    return Trackers(opened)
