"""The torch threads of one phase whose models run side by side (``threads_per_model`` with ``threads_claim_freed``).

:class:`Share` holds ``K`` threads per model; a model's task (:func:`claiming`, on its own Python thread) starts on
its ``K``, and when a task ends its threads go to the tasks still running (:func:`split`). A running task takes what
it was given at safe points only: :func:`poll`, called by the decode loop and by every update micro-batch, resizes
the calling thread's OpenMP team (``torch.set_num_threads`` is per calling thread, so only the task's own thread can
do it). Outside such a task :func:`poll` does nothing. Workers in other processes (``backend: ray``) cannot see the
task's thread: :class:`Pushed` hands them its allotment between their calls.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Callable, Iterator

import torch


def split(freed: int, running: list[str]) -> dict[str, int]:
    """``freed`` threads over the ``running`` models (in the models' order, not empty): ``freed // R`` each, one
    more to each of the first ``freed % R``."""
    base, extra = divmod(freed, len(running))
    return {name: base + (i < extra) for i, name in enumerate(running)}


class Share:
    """The threads of one side-by-side phase: ``k`` for each of ``names`` at the start; a finished model's go to
    the ones still running (:func:`split`). Thread-safe: releases are serialised, reads see a whole mapping."""

    def __init__(self, names: list[str], k: int) -> None:
        self._lock = threading.Lock()
        self._threads = dict.fromkeys(names, k)

    def threads(self, name: str) -> int:
        """``name``'s threads now (0 once it finished)."""
        return self._threads.get(name, 0)

    def release(self, name: str) -> None:
        """``name`` finished: its threads go to the models still running."""
        with self._lock:
            rest = {n: t for n, t in self._threads.items() if n != name}
            more = split(self._threads[name], list(rest)) if rest else {}
            self._threads = {n: t + more[n] for n, t in rest.items()}


@dataclass
class _Task:
    share: Share
    name: str
    start: int
    """The threads it started with."""
    applied: int
    """What this thread's ``torch.set_num_threads`` last got."""


class _Local(threading.local):
    task: _Task | None = None


_LOCAL = _Local()


@contextlib.contextmanager
def claiming(share: Share, name: str) -> Iterator[None]:
    """Run the body as ``name``'s task of ``share``, on the calling thread: torch on its threads, more at each
    :func:`poll` once others finished; at the end (an exception included) its threads go to the others."""
    k = share.threads(name)
    torch.set_num_threads(k)
    _LOCAL.task = _Task(share, name, k, k)
    try:
        yield
    finally:
        _LOCAL.task = None
        share.release(name)


def poll() -> None:
    """Inside a :func:`claiming` task: ``torch.set_num_threads`` of the calling thread to its allotment when that
    grew. Elsewhere a no-op (one attribute lookup)."""
    task = _LOCAL.task
    if task is not None:
        _apply(task)


def _apply(task: _Task) -> None:
    n = task.share.threads(task.name)
    if n > task.applied:
        torch.set_num_threads(n)
        task.applied = n


class Pushed:
    """The calling task's allotment for workers in other processes (``backend: ray``), which cannot see this thread:
    :meth:`check`, before each of their calls, ``push(n)``-es it when it grew past the start (or the last push);
    :meth:`restore` then ``push(None)``-es them back onto their own threads. So they react at call boundaries only.
    Outside a :func:`claiming` task, or with ``push`` None (in-process workers, which :func:`poll`), both do
    nothing."""

    def __init__(self, push: Callable[[int | None], object] | None) -> None:
        self.push, self.task = push, _LOCAL.task if push is not None else None
        self.last = self.task.start if self.task is not None else 0

    @property
    def active(self) -> bool:
        """Pushing: inside a :func:`claiming` task, for workers in other processes."""
        return self.task is not None

    def check(self) -> None:
        n = self.task.share.threads(self.task.name) if self.task is not None else 0
        if n > self.last and self.push is not None:
            self.push(n)
            self.last = n

    def restore(self) -> None:
        if self.task is not None and self.push is not None and self.last > self.task.start:
            self.push(None)
            self.last = self.task.start
