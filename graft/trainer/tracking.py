"""Experiment trackers (``logging.report_to``): TensorBoard, Weights & Biases and MLflow.

The training loop calls three things and nothing else::

    check_trackers(cfg.logging)                  # in setup(), before any model loads
    tracker = open_trackers(run_dir, cfg, start_step)
    tracker.log(step, metrics, completions)      # after each metrics.jsonl line
    tracker.close()

What is logged, per step and at that step index: every key of the step's ``metrics.jsonl``
record that holds a number there (``step`` itself is the x axis; NaN/inf, written as ``null``
in ``metrics.jsonl``, and ``None`` are left out), so in-training evaluation
(``eval/M/val/pass@1``, ``eval/M/best_step``) arrives the same way. The resolved config is
logged once per (re)start: TensorBoard gets it as YAML text (tag ``config``, at step
``start_step - 1``) and, on a fresh run, as hparams (dotted keys, lists and ``None`` as text);
W&B gets it as the run config; MLflow as params (fresh run; MLflow params cannot change) and as the
artifact ``config.yaml``. MLflow metric names may not hold ``>`` or ``@``: ``->`` is written ``_to_``
and ``@`` ``_at_`` (``exchange/A_to_B/admitted``, ``eval/A/val/pass_at_1``).

Completions (``logging.log_completions`` per model and step, see :func:`completion_rows`): a
TensorBoard text table (tag ``completions/M``), a W&B table (key ``completions/M``), an MLflow JSON
artifact ``completions/step_NNNNNN.json``.

Files: TensorBoard writes ``RUN_DIR/tensorboard/events.out.tfevents.*``
(``tensorboard --logdir RUN_DIR/tensorboard``, or ``--logdir runs`` to compare runs); W&B
writes ``RUN_DIR/wandb/`` and keeps its run id in ``RUN_DIR/wandb/graft_run_id`` so that a
resumed run continues the same W&B run; MLflow writes the file store ``RUN_DIR/mlruns/`` (MLflow
3 keeps that store in maintenance mode and asks for ``MLFLOW_ALLOW_FILE_STORE=true``, which graft
sets for its own process; ``MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri
RUN_DIR/mlruns``) and its run id in ``RUN_DIR/mlruns/graft_run_id``.

Resume. A resumed run restarts at the checkpoint's step + 1, possibly re-running steps that
the killed process had already logged. TensorBoard: the writer is opened with
``purge_step=start_step``, so TensorBoard hides every earlier event at a step >= start_step and
each step appears once. W&B (online): the same run id is resumed and W&B ignores a step it has
already received (the first value is kept; a resumed graft run recomputes those steps
identically except for timings). W&B offline: each (re)start is a folder
``RUN_DIR/wandb/offline-run-*-ID`` with the same id; ``wandb sync RUN_DIR/wandb/offline-run-*``
uploads them in order into one run. MLflow: the same run id is continued; MLflow keeps every value
logged, so a step re-run after a resume has two values in the metric's history (its charts draw the
later one).

W&B without network: ``logging.wandb_mode: auto`` (default) uses ``WANDB_MODE`` when set, else
``online`` when an API key is configured (``WANDB_API_KEY``, or a ``~/.netrc`` entry written by
``wandb login``) and the W&B host (``WANDB_BASE_URL``, default api.wandb.ai) accepts a connection
within 3 s, and ``offline`` otherwise; ``offline`` needs no network and no account. The host is
probed once, in :func:`check_trackers`, before any model loads, and a fallback to offline is said in
one line. Asking for ``online`` (``logging.wandb_mode: online`` or ``WANDB_MODE=online``) with the
host unreachable stops the run there with one line (W&B itself would retry for ~2 minutes).
"""

from __future__ import annotations

import importlib.util
import math
import netrc
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any, Literal, Mapping, cast
from urllib.parse import urlparse

import yaml

from graft.config import Config, ConfigError, LoggingConfig, to_dict
from graft.console import say
from graft.policy.loading import unreachable_reason
from graft.registry import TRACKERS, WANDB_MODES

WANDB_HOST = "https://api.wandb.ai"
_WANDB_PROBES: dict[str, str | None] = {}


def check_trackers(logging_cfg: LoggingConfig) -> None:
    """Called in setup(), before any model loads: a one-line :class:`ConfigError` naming the pip command
    when a requested tracker's package is missing, or when W&B is asked to run online and its host is
    unreachable; one line on stderr when W&B will log offline although a key is configured."""
    for name in logging_cfg.report_to:
        module, pkg = TRACKERS[name].module, TRACKERS[name].package
        if importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"logging.report_to includes {name}, but the {module!r} package is not installed: "
                f"pip install {pkg}  (or pip install 'graft[trackers]')"
            )
    if "wandb" not in logging_cfg.report_to or wandb_mode(logging_cfg.wandb_mode) != "online":
        return
    reason = wandb_unreachable_reason()
    if reason is None:
        return
    if run_mode(logging_cfg.wandb_mode) == "online":  # online was asked for explicitly
        raise ConfigError(
            f"logging.wandb_mode: W&B is asked to run online, but its host is unreachable ({reason}); "
            "set logging.wandb_mode=offline (or auto) to log offline, and upload later with wandb sync"
        )
    say(
        f"logging: a W&B API key is configured but the W&B host is unreachable ({reason}); W&B logs offline "
        "(upload later: wandb sync RUN_DIR/wandb/offline-run-*)"
    )


def wandb_unreachable_reason(env: Mapping[str, str] | None = None) -> str | None:
    """Why the W&B host (``WANDB_BASE_URL``, default api.wandb.ai) does not accept a connection within 3 s,
    or ``None``; cached per host for the process."""
    url = (os.environ if env is None else env).get("WANDB_BASE_URL") or WANDB_HOST
    if url not in _WANDB_PROBES:
        _WANDB_PROBES[url] = unreachable_reason(url, timeout_s=3.0)
    return _WANDB_PROBES[url]


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
        return netrc.netrc(path).authenticators(host or "") is not None  # no host: only a default entry matches
    except (OSError, netrc.NetrcParseError):
        return False


@WANDB_MODES.register("auto")
def auto_wandb_mode(env: Mapping[str, str]) -> str:
    """``auto``: ``WANDB_MODE`` when set, else ``online`` with an API key and ``offline`` without one."""
    if env.get("WANDB_MODE"):
        return env["WANDB_MODE"]
    return "online" if has_wandb_credentials(env) else "offline"


@WANDB_MODES.register("online")
def online_wandb_mode(env: Mapping[str, str]) -> str:
    """``online``: whatever the environment says."""
    return "online"


@WANDB_MODES.register("offline")
def offline_wandb_mode(env: Mapping[str, str]) -> str:
    """``offline``: whatever the environment says."""
    return "offline"


def wandb_mode(setting: str, env: Mapping[str, str] | None = None) -> str:
    """The W&B mode ``logging.wandb_mode`` asks for in ``env`` (see the module doc; :func:`run_mode` adds the host)."""
    return WANDB_MODES[setting](os.environ if env is None else env)


def run_mode(setting: str, env: Mapping[str, str] | None = None) -> str:
    """The W&B mode to run in: :func:`wandb_mode`, except ``auto`` without ``WANDB_MODE`` falls back to
    ``offline`` when the W&B host is unreachable."""
    env = os.environ if env is None else env
    mode = wandb_mode(setting, env)
    if mode == "online" and setting == "auto" and not env.get("WANDB_MODE") and wandb_unreachable_reason(env):
        return "offline"
    return mode


@TRACKERS.register("tensorboard")
class TensorBoardTracker:
    module, package = "tensorboard", "tensorboard"
    """The module it imports and the pip package that provides it (every tracker class says both)."""

    def __init__(self, run_dir: Path, cfg: Config, start_step: int) -> None:
        import torch.utils.tensorboard as tb  # deferred: the optional tensorboard package, asked for by report_to

        self.dir = run_dir / "tensorboard"
        # purge_step: TensorBoard drops earlier events at steps >= start_step (steps re-run after a resume)
        self.writer = tb.SummaryWriter(str(self.dir), purge_step=start_step if start_step > 1 else None)
        tree = to_dict(cfg)
        text = yaml.safe_dump(tree, sort_keys=False)
        self.writer.add_text("config", "".join("    " + line + "\n" for line in text.splitlines()), start_step - 1)
        if start_step == 1:
            metric_keys = {f"{m.name}/reward/mean": 0.0 for m in cfg.models}
            file_writer = self.writer.file_writer
            assert file_writer is not None  # SummaryWriter() opens it
            for part in tb.summary.hparams(flat_config(tree), metric_keys):
                file_writer.add_summary(part)
        self.writer.flush()

    def log(self, step: int, values: dict[str, float], completions: dict[str, list[dict]]) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        for name, rows in completions.items():
            self.writer.add_text(f"completions/{name}", markdown_table(rows), step)
        self.writer.flush()  # a killed run keeps every logged step

    def close(self) -> None:
        self.writer.close()


@TRACKERS.register("wandb")
class WandbTracker:
    module, package = "wandb", "wandb"

    def __init__(self, run_dir: Path, cfg: Config, start_step: int) -> None:
        import wandb  # deferred: an optional tracker, asked for by report_to

        self.wandb = wandb
        mode = run_mode(cfg.logging.wandb_mode)
        wdir = run_dir / "wandb"
        wdir.mkdir(parents=True, exist_ok=True)
        id_file = wdir / "graft_run_id"
        if start_step > 1 and id_file.is_file():
            run_id = id_file.read_text().strip()
        else:
            run_id = secrets.token_hex(4)  # W&B ids: lowercase letters and digits
            id_file.write_text(run_id + "\n")
        if mode == "offline" and cfg.logging.wandb_mode == "auto" and not has_wandb_credentials():
            say(f"logging: no W&B API key configured; W&B logs offline to {wdir} (upload later: wandb sync {wdir}/offline-run-*)")
        try:
            self.run = wandb.init(
                project=cfg.logging.wandb_project,
                name=run_dir.name,
                id=run_id,
                resume="allow",
                dir=str(run_dir),
                config=to_dict(cfg),
                # a WANDB_MODE from the environment is passed through as it is; wandb checks it
                mode=cast(Literal["online", "offline", "disabled", "shared"], mode),
                settings=wandb.Settings(console="off"),
            )
        except Exception as e:  # noqa: BLE001 - any failure to start is reported as one line
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(
                f"logging.report_to wandb: could not start a W&B run ({type(e).__name__}: {first}); "
                "set logging.wandb_mode=offline to log without network"
            ) from None

    def log(self, step: int, values: dict[str, float], completions: dict[str, list[dict]]) -> None:
        tables = {
            f"completions/{name}": self.wandb.Table(
                columns=list(COMPLETION_COLUMNS), data=[[r[c] for c in COMPLETION_COLUMNS] for r in rows]
            )
            for name, rows in completions.items()
        }
        self.run.log(values | tables, step=step)

    def close(self) -> None:
        self.run.finish()


@TRACKERS.register("mlflow")
class MLflowTracker:
    module, package = "mlflow", "mlflow-skinny"

    def __init__(self, run_dir: Path, cfg: Config, start_step: int) -> None:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3: the file store is opt-in
        import mlflow  # deferred: an optional tracker, asked for by report_to

        store = (run_dir / "mlruns").resolve()
        store.mkdir(parents=True, exist_ok=True)
        self.Metric = mlflow.entities.Metric
        self.client = mlflow.tracking.MlflowClient(tracking_uri=store.as_uri())
        id_file = store / "graft_run_id"
        if start_step > 1 and id_file.is_file():
            self.run_id = id_file.read_text().strip()
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            name = cfg.logging.mlflow_experiment
            exp = self.client.get_experiment_by_name(name)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
            self.run_id = self.client.create_run(exp_id, run_name=run_dir.name).info.run_id
            id_file.write_text(self.run_id + "\n")
            params = [mlflow.entities.Param(mlflow_key(k), str(v)[:6000]) for k, v in flat_config(to_dict(cfg)).items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
                self.client.log_batch(self.run_id, params=params[i : i + 100])
        self.client.log_text(self.run_id, yaml.safe_dump(to_dict(cfg), sort_keys=False), "config.yaml")

    def log(self, step: int, values: dict[str, float], completions: dict[str, list[dict]]) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self.Metric(mlflow_key(k), float(v), now, step) for k, v in values.items()])
        if completions:
            self.client.log_dict(self.run_id, completions, f"completions/step_{step:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def mlflow_key(key: str) -> str:
    """A metric or param name MLflow accepts (letters, digits, ``_ - . : /`` and spaces): ``->`` becomes
    ``_to_``, ``@`` ``_at_``, any other character ``_``."""
    key = key.replace("->", "_to_").replace("@", "_at_")
    return re.sub(r"[^\w\-. :/]", "_", key)


COMPLETION_COLUMNS = ("step", "model", "prompt_id", "prompt", "completion", "reward", "advantage")
"""Columns of the completions a tracker receives (:func:`graft.trainer.metrics.completion_rows`)."""


def markdown_table(rows: list[dict]) -> str:
    """``rows`` as a Markdown table of :data:`COMPLETION_COLUMNS` (``|`` escaped, line breaks as ``<br>``)."""
    cell = lambda v: "<br>".join(str(v).replace("|", "\\|").splitlines())  # noqa: E731
    lines = ["| " + " | ".join(COMPLETION_COLUMNS) + " |", "|" + "---|" * len(COMPLETION_COLUMNS)]
    lines += ["| " + " | ".join(cell(r[c]) for c in COMPLETION_COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


class Trackers:
    """The open trackers of a run (possibly none): ``log(step, metrics)``, ``close()``."""

    def __init__(self, backends: list) -> None:
        self.backends = backends

    def log(self, step: int, metrics: Mapping[str, Any], completions: dict[str, list[dict]] | None = None) -> None:
        """Send the numbers of ``metrics`` and ``completions`` (model -> rows of :data:`COMPLETION_COLUMNS`)."""
        values = scalars(metrics)
        for b in self.backends:
            b.log(step, values, completions or {})

    def close(self) -> None:
        for b in self.backends:
            try:
                b.close()
            except Exception as e:  # noqa: BLE001 - closing a tracker must not hide the run's own error
                say(f"logging: closing {getattr(b, 'module', type(b).__name__)} failed: {e}")
        self.backends = []


def open_trackers(run_dir: str | Path, cfg: Config, start_step: int = 1) -> Trackers:
    """Open every tracker of ``cfg.logging.report_to`` for a run that starts (or resumes) at ``start_step``
    (:func:`check_trackers` has run)."""
    opened: list = []
    try:
        for name in cfg.logging.report_to:
            opened.append(TRACKERS[name](Path(run_dir), cfg, start_step))
    except BaseException:
        Trackers(opened).close()
        raise
    return Trackers(opened)
