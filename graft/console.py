"""How every ``graft`` command talks on stderr: one :mod:`logging` setup (``-v``/``-q``), and progress bars
only on a terminal.

What graft says to the person running a command goes through :func:`say` (a notice such as "resumed from ...", a
warning worded for the reader, ``train``'s line per step, a benchmark's progress): shown as it is by default and with
``-v``, dropped with ``-q``, which keeps errors and the command's final summary only (docs/commands.md says what that
is for each command). The summary and a command's result are plain prints: nothing silences them.

Off a terminal (a log file, a pipe, CI) nothing draws a ``\\r`` bar: graft's own bars are off
(:func:`bars`), and so are those of the Hugging Face hub, transformers (weight loading), datasets and any
other tqdm bar that keeps tqdm's defaults (:func:`quiet_bars`, inherited by child processes through the
environment). Long phases report instead with an occasional plain line at INFO level (``graft -v``).
Importing this module loads neither torch nor transformers.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

GLOBAL_FLAGS = {"-v": 1, "--verbose": 1, "-vv": 2, "-q": -1, "--quiet": -1}
"""The flags every command takes, before or after its name, and the verbosity step of each."""

QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
"""Read at import by huggingface_hub (and so transformers), tqdm and datasets, here and in child processes."""

LEVELS = {-1: logging.ERROR, 0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG}

NOTICE = 25
"""The level of :func:`say`'s lines: above INFO (shown without ``-v``), below WARNING and ERROR (dropped by ``-q``)."""
logging.addLevelName(NOTICE, "NOTICE")

HARMLESS_WARNINGS = ((FutureWarning, r"`is_gradient_checkpointing` is deprecated"),)
"""(category, message regex) of third-party warnings that say nothing about a graft run: filtered out."""


def on_terminal() -> bool:
    """Whether stderr is a terminal (a person watching, who can take ``\\r`` progress bars)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by an object without a file, or closed
        return False


def bars(wanted: bool = True) -> bool:
    """Whether to draw a progress bar: asked for, stderr a terminal and no ``-q``."""
    return bool(wanted) and on_terminal() and not quiet()


def quiet_bars() -> None:
    """No progress bars from the hub, transformers, datasets or default tqdm, in this process (libraries
    already imported included) and in the processes it starts."""
    os.environ.update(QUIET_ENV)
    hf_logging = sys.modules.get("transformers.utils.logging")
    if hf_logging is not None:
        hf_logging.disable_progress_bar()
    hub_utils = sys.modules.get("huggingface_hub.utils")
    if hub_utils is not None:
        hub_utils.disable_progress_bars()
    datasets = sys.modules.get("datasets")
    if datasets is not None and hasattr(datasets, "disable_progress_bars"):
        datasets.disable_progress_bars()


class _Stderr(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is at each record (tests and ``contextlib.redirect_stderr`` replace it), through
    tqdm when it is loaded, so that a line never breaks a progress bar drawn on the terminal."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass

    def emit(self, record: logging.LogRecord) -> None:
        tqdm = sys.modules.get("tqdm")
        if tqdm is None or not hasattr(tqdm, "tqdm"):
            return super().emit(record)
        try:
            tqdm.tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except Exception:  # noqa: BLE001 - logging's own contract: a failing handler reports and goes on
            self.handleError(record)


class _Format(logging.Formatter):
    """``LEVEL logger: message``; :func:`say`'s lines as they are."""

    def format(self, record: logging.LogRecord) -> str:
        return record.getMessage() if record.levelno == NOTICE else super().format(record)


_HANDLER = _Stderr()
_HANDLER.setFormatter(_Format("%(levelname)s %(name)s: %(message)s"))
_NOTICES = logging.getLogger("graft.notice")
_NOTICES.setLevel(NOTICE)
_NOTICES.addHandler(_HANDLER)  # shown without setup_logging too (graft used from Python); -q raises the handler's level
_NOTICES.propagate = False


def say(line: str) -> None:
    """One line for the person running the command, on stderr: at the default verbosity and with ``-v``, not with
    ``-q`` (logger ``graft.notice``, level :data:`NOTICE`)."""
    _NOTICES.log(NOTICE, line)


def quiet() -> bool:
    """Whether ``-q`` is in force: :func:`say`'s lines and progress bars are dropped."""
    return _HANDLER.level > NOTICE


def split_flags(argv: list[str]) -> tuple[int, list[str]]:
    """``(verbosity, argv without the global flags)``; flags after ``--`` belong to the command."""
    verbosity = 0
    rest: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--":
            return verbosity, rest + argv[i:]
        if arg in GLOBAL_FLAGS:
            verbosity += GLOBAL_FLAGS[arg]
        else:
            rest.append(arg)
    return verbosity, rest


def setup_logging(verbosity: int = 0) -> None:
    """One handler on stderr for every logger: WARNING (and :func:`say`'s lines) by default, graft's INFO with ``-v``
    (DEBUG with ``-vv``), ERROR only with ``-q``; Python warnings go through it too, less :data:`HARMLESS_WARNINGS`."""
    level = LEVELS[max(-1, min(2, verbosity))]
    _HANDLER.setLevel(level if level >= logging.ERROR else min(level, NOTICE))
    root = logging.getLogger()
    if _HANDLER not in root.handlers:
        root.addHandler(_HANDLER)
    logging.getLogger("graft").setLevel(level if level < logging.WARNING else logging.NOTSET)
    logging.captureWarnings(True)
    for category, message in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    if level >= logging.ERROR:
        _quiet_transformers()


def _quiet_transformers() -> None:
    """transformers logs through its own handler: errors only, now and when it is imported later."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    hf_logging = sys.modules.get("transformers.utils.logging")
    if hf_logging is not None:
        hf_logging.set_verbosity_error()
