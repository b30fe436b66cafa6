"""Grader worker process: receives batches of items over a pipe, answers one message per item.

Protocol (parent -> worker): a list of ``(index, response, answer)`` tuples, or ``None``
to stop. Worker -> parent: ``("ready", pid)`` once after start-up, then
``(index, reward, status)`` for every item, in order, as soon as it is graded, so the
parent always knows which item is running and since when (its hard timeout is
measured from the previous answer). ``("fatal", message)`` when the verify function
cannot be imported.

Only light imports here (no torch): this module is the forkserver preload.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Callable

from graft.reward import verifier
from graft.signals import as_worker

DEFAULT_VERIFY_FN = "graft.reward.verifier:verify"
NUMBER_VERIFY_FN = "graft.reward.verifier:verify_number"


def resolve(path: str, kwargs: dict | None = None) -> Callable[[str, str], tuple[float, str]]:
    """Import ``"package.module:function"``, bound to ``kwargs`` (a domain's settings) when given."""
    module, sep, name = path.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"verify_fn must look like 'package.module:function', got {path!r}")
    fn = getattr(importlib.import_module(module), name)
    return functools.partial(fn, **kwargs) if kwargs else fn


def main(conn, verify_fn: str, sys_path: list[str], verify_kwargs: dict | None = None) -> None:
    """Worker entry point (the target of the grader's worker processes)."""
    as_worker()  # the parent stops us, once the item in hand is answered (graft.signals)
    for p in reversed(sys_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        fn = resolve(verify_fn, verify_kwargs)
        warm_up = getattr(importlib.import_module(verify_fn.partition(":")[0]), "warm_up", None)
        if callable(warm_up):  # the verify module's one-off start-up (math_verify's grammars, the sandbox's self-test)
            warm_up()
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises
        conn.send(("fatal", f"cannot load verify_fn {verify_fn!r}: {type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            return
        if batch is None:
            return
        for index, response, answer in batch:
            try:
                reward, status = fn(response, answer)
                out = (index, float(reward), str(status))
            except Exception:  # noqa: BLE001 - a broken item scores 0
                out = (index, 0.0, verifier.ERROR)
            try:
                conn.send(out)
            except OSError:  # the parent is gone (BrokenPipeError): exit quietly
                return
