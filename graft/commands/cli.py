"""graft: RL with verifiable rewards for several models that hand each other rollout groups.
Commands: train, eval, grade, probe, config, export, analyze, samples, report, store, sweep, experiment, onestep,
splits, bench.

    graft --version
    graft [-v | -q] COMMAND ...   (-v: progress and info lines, -q: errors only; also after COMMAND)
    graft train CONFIG [key=value ...]   (CONFIG: a YAML file, or a packaged config's name: default, trio, ...)
    graft eval --config RUN/config.yaml --model-name NAME [--model best|latest|base|PATH] [--compare base] [--data SET]
    graft eval --model PATH --data math500 [--n 8 --repeats 5]
    graft grade CONFIG.yaml --responses FILE.jsonl [--data FILE] [--json] [key=value ...]
    graft probe CONFIG.yaml [--prompts 64] [--compat] [--checkpoint STEP_DIR] [--out FILE] [key=value ...]
    graft config show CONFIG [key=value ...]
    graft export RUN_DIR [--step N|latest|best] [--model NAME] OUT [--dtype bfloat16]
    graft analyze RUN_DIR
    graft samples RUN_DIR [--from train|peer|eval] [--model M] [--reward both|1|0|any] [--steps 13-18] [-n 12]
    graft report RUN_DIR [RUN_DIR ...] [--out DIR]
    graft store info|export PATH ...
    graft sweep CONFIG.yaml --grid key=v1,v2 [--grid ...] [--print] [key=value ...]
    graft experiment run|summarize|print|status PLAN.yaml [--max-minutes M] [--only ARM ...]
    graft onestep CONFIG.yaml --at STEP [STEP ...] --out DIR [--seeds S ...] [--samples 16] [--unseen 4] [key=value ...]
    graft splits CONFIG.yaml --out DIR [--test 64] [--hard 64] [--seed 777] [--exclude FILE ...] [key=value ...]
    graft bench [--only a,b,c] [--reps 3] [--model M] [--models M1,M2] [--config CFG] [--out DIR] [key=value ...]
    graft bench train-step|rollout-phase|rollout-batch|update-precision|rollout-profile|gpu-check [flags]
"""

from __future__ import annotations

import difflib
import importlib
import itertools
import os
import select
import shlex
import sys

from graft import __version__
from graft.commands.parsers import config_parser, sweep_parser, train_parser
from graft.config import ConfigError, ConfigErrors, load_config, show_config
from graft.console import on_terminal, quiet, quiet_bars, setup_logging, split_flags
from graft.errors import UserError
from graft.files import output_error
from graft.signals import run_command
from graft.trainer.stop import DIVERGED_EXIT, PREEMPTED_EXIT, Diverged, Preempted

USAGE = __doc__


def train_main(argv: list[str]) -> int:
    args = train_parser().parse_args(argv)
    train = importlib.import_module("graft.api").train  # deferred: torch, transformers
    train(load_config(args.config, args.overrides))
    return 0


def config_main(argv: list[str]) -> int:
    args = config_parser().parse_args(argv)
    print(show_config(load_config(args.config, args.overrides)))
    return 0


def sweep_main(argv: list[str]) -> int:
    args = sweep_parser().parse_args(argv)
    commands = sweep_commands(args.config, args.grid, args.overrides)
    for cmd in commands:
        if args.print or not quiet():  # the command list is --print's result; a running sweep's progress
            print(shlex.join(cmd))
        if not args.print:
            rc = run_command(cmd)  # a session of its own; SIGTERM if this process dies (graft.signals)
            if rc != 0:
                print(f"error: sweep member failed with exit code {rc}", file=sys.stderr)
                return rc
    return 0


def sweep_commands(config: str, grid: list[str], overrides: list[str]) -> list[list[str]]:
    """One ``graft train`` command per grid point, each with its own run_dir suffix."""
    axes = []
    for item in grid:
        if "=" not in item:
            raise ConfigError(f"--grid {item!r} must be key=v1,v2")
        key, values = item.split("=", 1)
        axes.append([(key, v) for v in values.split(",")])
    base = load_config(config, overrides).run_dir
    out = []
    for point in itertools.product(*axes) if axes else [()]:
        tag = "_".join(f"{k.split('.')[-1]}-{v}" for k, v in point) or "base"
        sets = [f"{k}={v}" for k, v in point]
        load_config(config, [*overrides, *sets])  # validate every member before running any
        out.append([sys.executable, "-m", "graft.cli", "train", config, *overrides, *sets, f"run_dir={base}/{tag}"])
    return out


COMMANDS = {
    "train": ("graft.commands.cli", "train_main"),
    "eval": ("graft.commands.eval_cli", "eval_main"),
    "grade": ("graft.commands.grade_cli", "grade_main"),
    "probe": ("graft.commands.probe", "probe_main"),
    "config": ("graft.commands.cli", "config_main"),
    "export": ("graft.commands.export", "export_main"),
    "analyze": ("graft.commands.analyze", "analyze_main"),
    "samples": ("graft.commands.samples", "samples_main"),
    "report": ("graft.commands.report", "report_main"),
    "store": ("graft.commands.store", "store_main"),
    "sweep": ("graft.commands.cli", "sweep_main"),
    "experiment": ("graft.commands.experiment", "experiment_main"),
    "onestep": ("graft.commands.onestep", "onestep_main"),
    "splits": ("graft.commands.splits", "splits_main"),
    "bench": ("graft.bench.args", "bench_main"),
}
"""Command name -> (module, function) of its entry point, imported on use: ``graft --help``, ``graft config`` and
``graft COMMAND --help`` (:data:`PARSERS`) do not load torch and transformers."""

PARSERS = {name: ("graft.commands.parsers", f"{name}_parser") for name in COMMANDS} | {
    "bench": ("graft.bench.args", "bench_parser")
}
"""Command name -> (module, function) building its argument parser, in a module that imports no torch: the parser its
entry point parses with, and that answers ``graft COMMAND --help`` alone."""


def unknown_command(cmd: str) -> str:
    """The one-line refusal of a command graft does not have, with the closest one when there is one."""
    close = difflib.get_close_matches(cmd, COMMANDS, n=1)
    if close:
        return f"unknown command {cmd!r}; did you mean {close[0]!r}?"
    return f"unknown command {cmd!r}; commands: {', '.join(COMMANDS)} (graft --help)"


def _dispatch(cmd: str, argv: list[str]) -> int:
    if cmd not in COMMANDS:
        print(f"error: {unknown_command(cmd)}", file=sys.stderr)
        return 2
    if "-h" in argv or "--help" in argv:  # answered by the parser alone: the command's module (torch) stays unloaded
        module, func = PARSERS[cmd]
        getattr(importlib.import_module(module), func)().parse_args(argv)
    module, func = COMMANDS[cmd]
    return getattr(importlib.import_module(module), func)(argv)


def _run(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"graft {__version__}")
        return 0
    return _dispatch(argv[0], argv[1:])


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports POLLERR on its write end)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):  # no real file behind stdout (captured, closed)
        return False


def _setup_output(argv: list[str]) -> list[str]:
    """Logging and progress bars of the command (:mod:`graft.console`); ``argv`` without the global flags. The
    verbosity reaches the graft commands this one starts (sweep, experiment) through ``GRAFT_VERBOSITY``."""
    verbosity, rest = split_flags(argv)
    inherited = os.environ.get("GRAFT_VERBOSITY", "")
    if len(rest) == len(argv) and inherited.lstrip("-").isdigit():
        verbosity = int(inherited)
    os.environ["GRAFT_VERBOSITY"] = str(verbosity)
    setup_logging(verbosity)
    if not on_terminal() or verbosity < 0:
        quiet_bars()
    return rest


def main(argv: list[str] | None = None) -> int:
    argv = _setup_output(sys.argv[1:] if argv is None else argv)
    try:
        rc = _run(argv)
        sys.stdout.flush()  # a reader gone early (`| head`) surfaces here, in the handler below, not at exit
        return rc
    except Preempted as e:  # a SIGTERM/SIGINT: the finished steps are checkpointed
        print(e, file=sys.stderr)
        return PREEMPTED_EXIT
    except Diverged as e:
        print(f"error: {e}", file=sys.stderr)
        return DIVERGED_EXIT
    except (UserError, FileNotFoundError) as e:
        for error in e.errors if isinstance(e, ConfigErrors) else [e]:  # a config's errors, one line each
            print(f"error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `graft ... | head` closed the pipe: stop quietly, as `cat` would
        if not _stdout_reader_gone():  # another pipe broke (a worker's): not the reader's doing
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit-time flush must not fail again
        return 128 + 13  # SIGPIPE's exit status
    except OSError as e:  # disk full, permissions, a file where a folder should be: one line, no traceback
        err = output_error(e, e.filename or "?")
        if err is None:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
