"""A user's own reward functions (``reward.function``), TRL-style, run in a worker process with a timeout.

Each function is named ``"package.module:callable"`` or ``"path/to/file.py:callable"`` and called once per
grading pass on the whole batch, as TRL's ``GRPOTrainer`` calls its ``reward_funcs``::

    f(prompts=[...], completions=[...], completion_ids=[...], id=[...], <every other column>=[...])

- ``prompts``: each item's problem text; for a conversational prompt its list of chat messages, as written.
- ``completions``: each response text; for a conversational prompt ``[{"role": "assistant", "content": text}]``
  (TRL's form).
- ``completion_ids``: each response's token ids in the tokenizer of the model that trains on it (the tokens it
  sampled; a peer's response as the receiver re-tokenized it), or ``None`` where no tokens are known (``graft
  grade``, stored evaluation responses graded again).
- one keyword per data column, a list with an entry per item (``None`` where a row lacks the column): every column
  under its own name, and the columns ``data.fields`` maps under graft's names too (``data.fields.answer=solution``:
  both ``solution`` and ``answer``); ``id`` always (derived from the row when it has none). Never ``problem`` (that
  is ``prompts``) nor TRL's ``prompt`` column when it is the problem (also ``prompts``, as in TRL). A data column may
  not be named ``prompts``, ``completions`` or ``completion_ids``. TRL's ``trainer_state`` is not passed.

Each returns one float per completion, or ``None`` for a completion it cannot grade. The reward of a completion is
the ``weights``-weighted sum of the values it got (none at all: 0 with status ``no_answer``).

The functions never run in the trainer's process (``workers=0`` aside, for debugging): a worker process imports
them once and the parent waits at most ``timeout_s`` for each function's answer. A function that cannot be
imported, raises, hangs, returns something other than a list (or tuple, or 1-D array) of numbers and ``None`` (a
dict, a string, nested lists, a bool), the wrong number of values or a non-finite one is a
:class:`RewardFunctionError` naming it (one line), or with ``on_error="zero"`` that batch scores 0 (statuses
``function_error``/``function_timeout``, which do not stop the run as a hanging verifier's ``timeout`` does) and a
line on stderr says why.

Each item's reference (``Prompt.answer``) is its row as JSON (:func:`row_reference`), so everything a function
reads travels with the rollout groups, the trajectory store and the eval records.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import math
import numbers
import pickle
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import cloudpickle  # type: ignore[import-untyped]

from graft.console import say
from graft.errors import UserError
from graft.registry import ON_ERRORS
from graft.reward import verifier
from graft.reward.grader import mp_context, worker_memory_mb
from graft.signals import as_worker, start_worker, stopping

__all__ = ["FunctionGrader", "RewardFunctionError", "code_digest", "function_names", "load_object", "row_reference"]


class RewardFunctionError(UserError, RuntimeError):
    """A reward function that cannot be loaded or called, or gave an unusable result."""


FUNCTION_TIMEOUT = "function_timeout"
FUNCTION_ERROR = "function_error"
"""Statuses of a batch scored 0 under ``on_error="zero"`` (not the grader's ``timeout``/``error``: the run goes on,
as asked, instead of stopping as for a hanging verifier)."""


@ON_ERRORS.register("stop")
def stop_on_error(message: str, status: str, n: int) -> tuple[list[float], list[str]]:
    """A failed batch stops the run: :class:`RewardFunctionError` with ``message`` (one line)."""
    raise RewardFunctionError(message + " (reward.on_error=zero scores such a batch 0 instead)")


@ON_ERRORS.register("zero")
def zero_on_error(message: str, status: str, n: int) -> tuple[list[float], list[str]]:
    """A failed batch of ``n`` scores 0, every response with ``status``; one warning line, and the run goes on."""
    say(f"warning: {message}; this batch of {n} scores 0 (reward.on_error=zero)")
    return [0.0] * n, [status] * n


KEYWORDS = ("prompts", "completions", "completion_ids")
"""The keyword arguments every function gets besides the columns; a data column may not use these names."""


def function_names(functions: Sequence[str | Callable[..., Any]]) -> list[str]:
    """The name each reward function's values are logged under (``rewards/NAME/mean``), as TRL names a reward
    function: the callable's own name (``"my_rewards.py:correct"`` -> ``correct``; a callable -> its ``__name__``).
    A name several functions share gets each one's position in the list: ``correct_0``, ``correct_1``."""
    names = [f.rpartition(":")[2] if isinstance(f, str) else getattr(f, "__name__", type(f).__name__) for f in functions]
    return [f"{n}_{i}" if names.count(n) > 1 else n for i, n in enumerate(names)]


def row_reference(row: Mapping[str, Any]) -> str:
    """A data row (graft's field names, every other column kept) as the JSON reference of a reward function."""
    return json.dumps(dict(row), sort_keys=True, default=str)


def load_object(spec: str, key: str) -> Any:
    """The object ``"package.module:attr"`` or ``"path/to/file.py:attr"`` names; a one-line
    :class:`RewardFunctionError` naming ``key`` (the config field) when it cannot be had."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr.isidentifier():
        raise RewardFunctionError(f"{key}: {spec!r} must look like 'package.module:name' or 'path/to/file.py:name'")
    try:
        module = _import_file(target, key) if target.endswith(".py") else importlib.import_module(target)
    except RewardFunctionError:
        raise
    except BaseException as e:  # noqa: BLE001 - whatever the user's module raises on import
        raise RewardFunctionError(f"{key}: cannot import {target!r}: {type(e).__name__}: {e}") from None
    if not hasattr(module, attr):
        raise RewardFunctionError(f"{key}: {target!r} has no attribute {attr!r}")
    return getattr(module, attr)


def function_name(spec: str | Callable[..., Any]) -> str:
    """How messages and metrics name a reward function: its spec (``"file.py:fn"``), or a callable's ``__name__``
    (TRL's naming; a ``functools.partial`` or callable object: its type's name)."""
    if isinstance(spec, str):
        return spec
    return getattr(spec, "__name__", None) or type(getattr(spec, "func", spec)).__name__


def shipped(spec: str | Callable[..., Any], key: str) -> str | bytes:
    """What the worker process is sent for one function: its spec, or a callable pickled by value where it lives in
    the user's script or notebook (cloudpickle; by reference where its module can be imported). One line naming
    ``key`` for a callable that cannot be pickled (it holds a lock, an open file, a model...)."""
    if isinstance(spec, str):
        return spec
    try:
        return cloudpickle.dumps(spec)
    except Exception as e:  # noqa: BLE001 - whatever the object holds that cannot be pickled
        raise RewardFunctionError(
            f"{key}: cannot send {function_name(spec)} to the reward worker process ({type(e).__name__}: {e}); "
            "build what it holds inside the function, or set reward.workers=0 to call it in this process"
        ) from None


def load_function(spec: str | bytes | Callable[..., Any], key: str) -> Callable[..., Any]:
    """The function a spec names, a shipped callable unpickled, or the callable itself."""
    if isinstance(spec, bytes):
        try:
            return pickle.loads(spec)
        except Exception as e:  # noqa: BLE001 - the user's module may be missing here
            raise RewardFunctionError(f"{key}: cannot load the reward function in its worker: {type(e).__name__}: {e}") from None
    return load_object(spec, key) if isinstance(spec, str) else spec


def code_digest(obj: str | Callable[..., Any], key: str) -> str | None:
    """The sha256 of the code ``obj`` names or is, which a run records as part of its identity (a reward function, a
    user domain or its verify function): ``"path/to/file.py:name"`` -> the file's bytes; ``"package.module:name"``
    -> its module's file, found without running that module; a callable -> the file of the module defining it, or
    its source where it has no file. ``None`` for graft's own code (graft's version says what that is) and for a
    module without a file. One line naming ``key`` when the file or module is not there -- before any model loads."""
    if callable(obj):
        try:
            path = inspect.getsourcefile(obj)
            if path is None or not Path(path).is_file():
                return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()
        except (OSError, TypeError) as e:
            raise RewardFunctionError(f"{key}: cannot read the code of {obj!r}: {e}") from None
        return _file_digest(Path(path))
    target, sep, attr = obj.rpartition(":")
    if not sep or not target or not attr.isidentifier():
        raise RewardFunctionError(f"{key}: {obj!r} must look like 'package.module:name' or 'path/to/file.py:name'")
    if target.endswith(".py"):
        p = Path(target).expanduser().resolve()
        if not p.is_file():
            raise RewardFunctionError(f"{key}: file not found: {p}")
        return _file_digest(p)
    if target.split(".")[0] == "graft":
        return None
    try:
        spec = importlib.util.find_spec(target)
    except BaseException as e:  # noqa: BLE001 - whatever the user's parent package raises on import
        raise RewardFunctionError(f"{key}: cannot import {target!r}: {type(e).__name__}: {e}") from None
    if spec is None:
        raise RewardFunctionError(f"{key}: cannot import {target!r}: no module named {target!r}")
    origin = Path(spec.origin) if spec.origin else None
    return _file_digest(origin) if origin is not None and origin.is_file() else None


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _import_file(path: str, key: str) -> Any:
    """The module of a ``.py`` file, imported once; its folder goes first on ``sys.path`` (as for a script), so
    that it can import the modules beside it."""
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise RewardFunctionError(f"{key}: file not found: {p}")
    if str(p.parent) not in sys.path:
        sys.path.insert(0, str(p.parent))
    name = "graft_user_" + "".join(c if c.isalnum() else "_" for c in str(p))
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, p)
        if spec is None or spec.loader is None:
            raise RewardFunctionError(f"{key}: cannot import {p}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
    return sys.modules[name]


def _batch(
    references: Sequence[str], completions: Sequence[str], completion_ids: Sequence[Sequence[int] | None] | None = None
) -> tuple[list, list, dict[str, list]]:
    """``(prompts, completions, columns)`` of a batch of JSON row references (see the module doc): each row's
    ``problem`` (text, or a conversation's messages), the completions (a conversation's as one assistant message) and
    every other column as a list, ``completion_ids`` among them."""
    rows = []
    for i, r in enumerate(references):
        try:
            row = json.loads(r)
        except (TypeError, json.JSONDecodeError):
            row = None
        if not isinstance(row, dict):
            raise RewardFunctionError(
                f"item {i}'s reference {str(r)[:40]!r} is not a data row: reward.function grades "
                "rows graft loaded with it (a stored peer from a run graded otherwise is not)"
            )
        rows.append(row)
    keys = sorted({k for r in rows for k in r} - {"problem"})
    clash = [k for k in keys if k in KEYWORDS]
    if clash:
        raise RewardFunctionError(
            f"data column {clash[0]!r} has the name of a reward function's own argument "
            f"({', '.join(KEYWORDS)}); rename it in the file"
        )
    prompts = [r.get("problem", "") for r in rows]
    pairs = zip(prompts, completions, strict=True)
    said = [[{"role": "assistant", "content": c}] if isinstance(p, list) else c for p, c in pairs]
    ids = [None if t is None else [int(x) for x in t] for t in completion_ids] if completion_ids else [None] * len(rows)
    return prompts, said, {k: [r.get(k) for r in rows] for k in keys} | {"completion_ids": ids}


def _call(fn: Any, name: str, prompts: list[str], completions: list[str], columns: dict[str, list]) -> list:
    """One function's values for the batch, checked: ``("ok", values)`` or ``("error", message)``."""
    try:
        out = fn(prompts=prompts, completions=completions, **columns)
    except BaseException as e:  # noqa: BLE001 - the user's code
        return ["error", f"reward function {name} raised {type(e).__name__}: {e}"]
    values = _as_list(out)
    if values is None:
        return ["error", f"reward function {name} returned {_shown(out)}, not a list of floats (one per completion)"]
    if len(values) != len(completions):
        return ["error", f"reward function {name} returned {len(values)} values for {len(completions)} completions"]
    checked = []
    for i, v in enumerate(values):
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
            return ["error", f"reward function {name} returned {_shown(v)} for completion {i}, not a float or None"]
        x = None if v is None else float(v)
        if x is not None and not math.isfinite(x):
            return ["error", f"reward function {name} returned {x} for completion {i} (not finite)"]
        checked.append(x)
    return ["ok", checked]


def _as_list(out: Any) -> list | None:
    """The values of a list, a tuple or a one-dimensional array (numpy, torch); None for anything else (a dict, whose
    iteration gives its keys; a string, whose gives its characters; a scalar; a generator)."""
    if isinstance(out, (list, tuple)):
        return list(out)
    if getattr(out, "ndim", None) == 1 and callable(getattr(out, "tolist", None)):
        return list(out.tolist())
    return None


def _shown(v: Any) -> str:
    """A returned value as a message shows it: its type and a short repr (``dict {0: 1.0, 1: 0.0}``)."""
    text = repr(v)
    return f"{type(v).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def worker_main(conn, specs: list[str | bytes], sys_path: list[str], names: list[str]) -> None:
    """The worker process: imports the functions, then answers ``(prompts, completions, columns)`` batches with
    one ``["ok", values]`` / ``["error", message]`` message per function, in order."""
    as_worker()  # the parent stops us, once the batch in hand is answered (graft.signals)
    for p in reversed(sys_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        fns = [load_function(s, f"reward.function.{i}") for i, s in enumerate(specs)]
    except RewardFunctionError as e:
        conn.send(["fatal", str(e)])
        return
    conn.send(["ready", None])
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        for fn, name in zip(fns, names, strict=True):
            conn.send(_call(fn, name, *msg))


class FunctionGrader:
    """Grades with ``reward.function`` (see the module doc); the same ``grade``/``close`` as
    :class:`graft.reward.grader.Grader`.

    Args:
        specs: the functions: specs (``"file.py:fn"``) or callables.
        weights: one per function (``None``: 1 each).
        timeout_s: the longest one function may take on one batch.
        on_error: ``stop`` raises :class:`RewardFunctionError`; ``zero`` scores the batch 0.
        workers: 0 calls the functions in this process (no timeout; debugging and tests); otherwise one worker.
        memory_mb: the most resident memory the worker may use (checked four times a second while it works, where
            ``/proc`` can be read); beyond it the worker is killed and the batch fails as if the function raised.
            0: no limit.
    """

    def __init__(
        self,
        specs: Sequence[str | Callable[..., Any]],
        weights: Sequence[float] | None = None,
        timeout_s: float = 120.0,
        on_error: str = "stop",
        workers: int = 1,
        start_method: str | None = None,
        startup_timeout_s: float = 120.0,
        memory_mb: int = 0,
    ) -> None:
        self.specs, self.timeout_s, self.on_error = list(specs), float(timeout_s), on_error
        self.memory_mb, self._peak_mb = int(memory_mb), 0.0
        self.weights = list(weights) if weights is not None else [1.0] * len(self.specs)
        self.stats: dict[str, int] = {}
        self.labels = [function_name(s) for s in self.specs]
        """Each function as messages name it (its spec, or a callable's name)."""
        self.verify_fn = "reward.function: " + ", ".join(self.labels)
        self.names = function_names(self.specs)
        """Each function's name in the metrics (:func:`function_names`)."""
        self._ctx = mp_context(start_method) if workers > 0 else None
        self._local = [load_function(s, f"reward.function.{i}") for i, s in enumerate(self.specs)] if workers == 0 else None
        self._shipped = [shipped(s, f"reward.function.{i}") for i, s in enumerate(self.specs)] if workers > 0 else []
        self._startup_timeout_s = startup_timeout_s
        self._proc: BaseProcess | None = None
        self._conn: Connection | None = None
        if workers > 0:
            self._start()

    def _start(self) -> None:
        if self._ctx is None:
            raise RewardFunctionError("a FunctionGrader with workers=0 starts no worker process")
        parent, child = self._ctx.Pipe(duplex=True)
        self._proc = proc = self._ctx.Process(
            target=worker_main, args=(child, self._shipped, list(sys.path), self.labels), daemon=True, name="graft-reward-fn"
        )
        start_worker(proc)
        child.close()
        self._conn = parent
        msg = self._recv(self._startup_timeout_s, f"importing {', '.join(self.labels)}", "its start-up limit")
        if msg[0] != "ready":
            self.close()
            raise RewardFunctionError(str(msg[1]))

    def _recv(self, timeout_s: float, what: str, limit: str = "reward.function_timeout_s") -> list:
        """The worker's next message, or ``["timeout"|"error", message]`` when it does not come in time, dies or
        uses more memory than ``memory_mb``."""
        conn, proc = self._conn, self._proc
        assert conn is not None and proc is not None, "no worker: _start() first"
        deadline = time.monotonic() + timeout_s
        while not conn.poll(max(0.0, min(0.25, deadline - time.monotonic()))):
            if (over := self._over_memory()) is not None:
                self._kill()
                limit_mb = f"reward.function_memory_mb={self.memory_mb}"
                return ["error", f"the reward function worker used {over:.0f} MiB while {what}, more than {limit_mb}"]
            if time.monotonic() >= deadline:
                return ["timeout", f"{what} took longer than {limit}={timeout_s:g}s"]
        try:
            return conn.recv()
        except (EOFError, OSError):
            pass
        proc.join(timeout=2.0)
        return ["error", f"the reward function worker died while {what} (exit code {proc.exitcode})"]

    def _over_memory(self) -> float | None:
        """The worker's resident memory in MiB when beyond ``memory_mb``, else None (and its peak noted)."""
        mem = worker_memory_mb(self._proc.pid) if self._proc is not None and self._proc.pid is not None else None
        if mem is None:
            return None
        self._peak_mb = max(self._peak_mb, mem[1])
        return mem[0] if self.memory_mb and mem[0] > self.memory_mb else None

    @property
    def peak_rss_gb(self) -> float:
        """The highest peak resident memory of its worker processes so far, in GiB (the run's summary)."""
        self._over_memory()
        return self._peak_mb / 1024

    def grade(
        self,
        responses: list[str],
        answers: list[str],
        progress: bool = False,
        completion_ids: Sequence[Sequence[int] | None] | None = None,
    ) -> tuple[list[float], list[str]]:
        """Rewards and statuses (ok / no_answer; function_error / function_timeout under ``on_error="zero"``), one
        per response; ``completion_ids``: each response's token ids, when known (the functions' ``completion_ids``)."""
        rewards, statuses, _ = self.grade_parts(responses, answers, progress, completion_ids)
        return rewards, statuses

    def grade_parts(
        self,
        responses: list[str],
        answers: list[str],
        progress: bool = False,
        completion_ids: Sequence[Sequence[int] | None] | None = None,
    ) -> tuple[list[float], list[str], dict[str, list[float | None]]]:
        """:meth:`grade`, and besides the weighted sum each function's own values: ``{name: [value per response]}``
        (:attr:`names`; ``None`` where the function gave none, and for every response of a batch scored 0 under
        ``on_error="zero"``)."""
        if len(responses) != len(answers):
            raise ValueError(f"{len(responses)} responses but {len(answers)} answers")
        if not responses:
            return [], [], {name: [] for name in self.names}
        prompts, completions, columns = _batch(answers, responses, completion_ids)
        values, failure = self._values(prompts, completions, columns)
        if failure is not None:
            status, message = failure
            rewards, statuses = ON_ERRORS[self.on_error](message, status, len(responses))
            values = [[None] * len(responses) for _ in self.names]
        else:
            rewards, statuses = self._combine(values)
        for s in statuses:
            self.stats[s] = self.stats.get(s, 0) + 1
        return rewards, statuses, dict(zip(self.names, values, strict=True))

    def _values(self, prompts, completions, columns) -> tuple[list[list], tuple[str, str] | None]:
        """Every function's values, or the first failure as ``(status, message)``. A worker that dies while this
        process is stopping (:func:`graft.signals.stopping`) died of the stop, not of the batch: the batch is graded
        again, once, by a fresh worker, so an interrupted call is never scored."""
        if self._local is not None:
            results = [_call(fn, s, prompts, completions, columns) for fn, s in zip(self._local, self.labels, strict=True)]
        else:
            results, died = self._remote(prompts, completions, columns)
            if died and stopping():
                results, _ = self._remote(prompts, completions, columns)
        for res in results:
            if res[0] != "ok":
                return [], (FUNCTION_TIMEOUT if res[0] == "timeout" else FUNCTION_ERROR, res[1])
        return [r[1] for r in results], None

    def _remote(self, prompts, completions, columns) -> tuple[list[list], bool]:
        """The worker's answer for every function (a fresh worker when the last one is gone), and whether it died."""
        if self._proc is None or not self._proc.is_alive():
            self._start()
        conn, proc = self._conn, self._proc
        assert conn is not None and proc is not None  # _start() set both
        conn.send((prompts, completions, columns))
        results = []
        for name in self.labels:  # every function answers, even after another's error
            res = self._recv(self.timeout_s, f"reward function {name} on {len(completions)} completions")
            results.append(res)
            if res[0] == "timeout" or (res[0] == "error" and not proc.is_alive()):
                died = res[0] == "error"
                self._kill()  # hung or dead: the next batch starts a fresh worker
                return results, died
        return results, False

    def _combine(self, values: list[list]) -> tuple[list[float], list[str]]:
        rewards, statuses = [], []
        for i in range(len(values[0])):
            got = [(w, v[i]) for w, v in zip(self.weights, values, strict=True) if v[i] is not None]
            rewards.append(float(sum(w * x for w, x in got)))
            statuses.append(verifier.OK if got else verifier.NO_ANSWER)
        return rewards, statuses

    def _kill(self) -> None:
        if self._proc is not None:
            self._over_memory()  # its peak, before it goes
            self._proc.kill()
            self._proc.join(timeout=2.0)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def close(self) -> None:
        self._over_memory()  # its peak (VmHWM), while it is there to read
        if self._conn is not None:
            try:
                self._conn.send(None)
            except OSError:
                pass
            if self._proc is not None:
                self._proc.join(timeout=1.0)
        self._kill()

    def __enter__(self) -> "FunctionGrader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
