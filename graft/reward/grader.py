"""Batch grading with a hard wall-clock timeout per item.

``math_verify`` can hang (sympy simplification of adversarial answers; Math-Verify#65)
and its own SIGALRM timeout only works on the main thread, so items are graded in
worker processes and the parent kills a worker whose current item runs past
``timeout_s``: that item scores 0 with status ``timeout``, the rest of its batch is
handed out again and a fresh worker is started. A worker that dies (segfault, OOM
kill) costs its current item (status ``error``) the same way -- unless it died while this
process is stopping (:func:`graft.signals.stopping`): then the item is graded again, once, so
an item a stop interrupted is never scored. So is an item whose verify function answers status ``interrupted``
(:data:`graft.reward.verifier.INTERRUPTED`: a stop signal reached the code sandbox while it ran the program), in
the workers and in-process alike. ``grade`` therefore always returns, from any
thread or process (Ray actors included).

The workers follow graft's stop protocol (:mod:`graft.signals`): they ignore SIGTERM, SIGINT
and SIGHUP from birth, so a signal to the whole process group reaches the trainer alone, and
they are stopped here.

Workers come from a ``forkserver`` (``spawn`` where unavailable), never a plain
``fork`` of the trainer: forking a process whose torch/OpenMP threads hold locks can
deadlock the child. The forkserver preloads ``__main__`` and :mod:`graft.reward.preload`
(math_verify warmed up), so a replacement worker is ready in milliseconds. Setting that
preload is process-global in :mod:`multiprocessing`; it has effect only if graft starts
the forkserver first and it only adds a module to the default preload.

Cheap items can be decided in the calling process without a round trip (``quick``: the domain's check,
e.g. :func:`graft.reward.verifier.quick_verify` for no ``\\boxed{}``, identical answers, two integers), the
rest is sent in batches of up to ``chunk_size`` items per message.

``workers=0`` grades in the calling process: no timeout guarantee (a hanging item hangs
the caller); for debugging and tests only.

Timing: an item's clock starts when the worker's previous answer arrives (or when its
batch is sent), so time an item spends queued behind others in the same worker does not
count against it.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait as mp_wait
from typing import TYPE_CHECKING, cast

from tqdm import tqdm

from graft.reward import worker
from graft.reward.verifier import (
    ERROR as VERIFY_ERROR,
    INTERRUPTED as VERIFY_INTERRUPTED,
    NO_ANSWER as VERIFY_NO_ANSWER,
    OK as VERIFY_OK,
    TIMEOUT as VERIFY_TIMEOUT,
)
from graft.signals import start_worker, stopping

if TYPE_CHECKING:
    from multiprocessing.context import ForkServerContext, SpawnContext

__all__ = ["Grader", "GraderError"]


class _Tally:
    """One grading pass's bookkeeping: results in place, the count still open, the progress bar."""

    def __init__(self, pending: deque[int], rewards: list, statuses: list, bar) -> None:
        self.pending, self.rewards, self.statuses, self.bar = pending, rewards, statuses, bar
        self.remaining = len(pending)
        self.retried: set[int] = set()
        """Items handed out again (once each): their worker died while this process was stopping, or they were
        answered ``interrupted``."""

    def finish(self, i: int, reward: float, status: str) -> None:
        if status == VERIFY_INTERRUPTED and i not in self.retried:
            self.retried.add(i)  # a stop reached it mid-way: graded again, never scored
            self.pending.append(i)
            return
        self.rewards[i], self.statuses[i] = reward, status
        self.remaining -= 1
        self.bar.update(1)

    def requeue(self, w: "_Worker") -> None:
        """Items sent to a dead worker go back to the front."""
        self.pending.extendleft(reversed(w.inflight))
        w.inflight.clear()


def worker_memory_mb(pid: int) -> tuple[float, float] | None:
    """``(resident, peak resident)`` memory of process ``pid`` in MiB (``VmRSS``, ``VmHWM`` of ``/proc/PID/status``);
    None where that cannot be read (the process is gone, or no ``/proc``: not Linux)."""
    try:
        fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":" in line)
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024
    except (OSError, KeyError, ValueError, IndexError):
        return None


class GraderError(RuntimeError):
    """The grader cannot run (workers fail to start, or the verify function cannot be imported)."""


_PRELOAD_SET = False


def mp_context(start_method: str | None) -> SpawnContext | ForkServerContext:
    """The multiprocessing context of graft's worker processes: forkserver (preloading math_verify) or spawn; never fork."""
    global _PRELOAD_SET
    methods = mp.get_all_start_methods()
    method = start_method or ("forkserver" if "forkserver" in methods else "spawn")
    if method == "fork":
        raise ValueError("start_method='fork' is not allowed: forking a process with live torch threads can deadlock")
    ctx = mp.get_context(method)
    if method == "forkserver" and not _PRELOAD_SET:
        ctx.set_forkserver_preload(["__main__", "graft.reward.preload"])
        _PRELOAD_SET = True
    # get_context() is typed as the base class; any method but the refused fork gives one of these two
    # (an unknown name raises ValueError).
    return cast("SpawnContext | ForkServerContext", ctx)


class _Worker:
    """One worker process and the items it holds."""

    def __init__(self, ctx: SpawnContext | ForkServerContext, verify_fn: str, startup_timeout_s: float, verify_kwargs: dict):
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(
            target=worker.main, args=(child_conn, verify_fn, list(sys.path), verify_kwargs), daemon=True, name="graft-grader"
        )
        start_worker(self.proc)
        child_conn.close()
        self.conn = parent_conn
        self.ready = False
        self.inflight: deque[int] = deque()  # item indices sent, not yet answered, in order
        self.deadline = time.monotonic() + startup_timeout_s  # start-up deadline until ready

    def send(self, items: list[tuple[int, str, str]], timeout_s: float) -> None:
        self.inflight.extend(i for i, _, _ in items)
        self.deadline = time.monotonic() + timeout_s
        self.conn.send(items)

    def peak_mb(self) -> float:
        """Its peak resident memory so far (MiB; 0 where it cannot be read)."""
        mem = worker_memory_mb(self.proc.pid) if self.proc.pid is not None else None
        return mem[1] if mem else 0.0

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.join(timeout=2.0)
        except Exception:  # noqa: BLE001 - already gone
            pass
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001
            pass

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except Exception:  # noqa: BLE001 - broken pipe: it is dead already
            pass
        self.proc.join(timeout=1.0)
        if self.proc.is_alive():
            self.kill()
        else:
            self.conn.close()


class Grader:
    """Grades ``(response, reference answer)`` pairs; see the module docstring.

    Args:
        timeout_s: hard wall-clock limit per item (workers > 0 only).
        workers: worker processes; 0 grades in-process without a timeout.
        verify_fn: ``"package.module:function"`` with :func:`verify`'s signature, imported by
            the workers (the domain's, :class:`graft.domains.Domain`; default: graft's math verifier).
        quick: ``(response, reference) -> (reward, status) | None``, tried in the calling process first
            (``None``: send the item to a worker); ``None`` sends every item.
        verify_kwargs: keyword arguments of every ``verify_fn`` call (a domain's settings).
        start_method: ``forkserver`` (default where available) or ``spawn``.
        chunk_size: most items per message to a worker.
        startup_timeout_s: a worker not ready within this time is an error.

    ``stats`` counts statuses over the grader's lifetime; ``restarts`` counts replaced workers.
    Not re-entrant: concurrent ``grade`` calls are serialised by a lock.
    """

    def __init__(
        self,
        timeout_s: float = 5.0,
        workers: int = 2,
        verify_fn: str | None = None,
        start_method: str | None = None,
        chunk_size: int = 32,
        startup_timeout_s: float = 120.0,
        quick: Callable[[str, str], tuple[float, str] | None] | None = None,
        verify_kwargs: dict | None = None,
    ):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        self.timeout_s = float(timeout_s)
        self.num_workers = int(workers)
        self.verify_fn = verify_fn or worker.DEFAULT_VERIFY_FN
        self.quick = quick
        self.verify_kwargs = dict(verify_kwargs or {})
        self.chunk_size = max(1, int(chunk_size))
        self.startup_timeout_s = float(startup_timeout_s)
        self.stats: dict[str, int] = {VERIFY_OK: 0, VERIFY_NO_ANSWER: 0, VERIFY_TIMEOUT: 0, VERIFY_ERROR: 0}
        self.restarts = 0
        self._peak_mb = 0.0
        self._lock = threading.Lock()
        self._closed = False
        self._workers: list[_Worker] = []
        self._ctx = mp_context(start_method) if workers > 0 else None
        self._local_fn = worker.resolve(self.verify_fn, self.verify_kwargs) if workers == 0 else None
        try:
            for _ in range(self.num_workers):  # start now: they warm up while the models load
                self._workers.append(self._start())
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ public

    def grade_parts(
        self,
        responses: list[str],
        answers: list[str],
        progress: bool = False,
        completion_ids: Sequence[Sequence[int] | None] | None = None,
    ) -> tuple[list[float], list[str], dict[str, list[float | None]]]:
        """:meth:`grade`, and no reward functions' own values (``{}``: the domain's verifier is one reward; the same
        call as :meth:`graft.reward.functions.FunctionGrader.grade_parts`)."""
        return (*self.grade(responses, answers, progress, completion_ids), {})

    def grade(
        self,
        responses: list[str],
        answers: list[str],
        progress: bool = False,
        completion_ids: Sequence[Sequence[int] | None] | None = None,
    ) -> tuple[list[float], list[str]]:
        """Rewards (1.0/0.0) and statuses (ok/no_answer/timeout/error), one per response (``completion_ids``, the
        responses' tokens, are for a user's reward functions: a verifier grades the text)."""
        if len(responses) != len(answers):
            raise ValueError(f"{len(responses)} responses but {len(answers)} answers")
        with self._lock:
            if self._closed:
                raise GraderError("grade() on a closed Grader")
            n = len(responses)
            rewards: list[float] = [0.0] * n
            statuses: list[str] = [""] * n
            bar = tqdm(total=n, desc="verify", disable=not progress, leave=False, file=sys.stderr)
            pending: deque[int] = deque()
            for i in range(n):
                quick = self.quick(responses[i], answers[i]) if self.quick is not None else None
                if quick is None:
                    pending.append(i)
                else:
                    rewards[i], statuses[i] = quick
                    bar.update(1)
            if pending:
                if self.num_workers == 0:
                    for i in pending:
                        rewards[i], statuses[i] = self._local(responses[i], answers[i])
                        if statuses[i] == VERIFY_INTERRUPTED:  # graded again, once (as by the workers)
                            rewards[i], statuses[i] = self._local(responses[i], answers[i])
                        bar.update(1)
                else:
                    try:
                        self._run(pending, responses, answers, rewards, statuses, bar)
                    except BaseException:  # GraderError, Ctrl-C: leave no worker behind
                        self._closed = True
                        for w in self._workers:
                            w.kill()
                        self._workers = []
                        raise
            bar.close()
            for s in statuses:
                self.stats[s] = self.stats.get(s, 0) + 1
            return rewards, statuses

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        with self._lock:
            self._closed = True
            workers, self._workers = self._workers, []
        for w in workers:
            self._peak_mb = max(self._peak_mb, w.peak_mb())
            w.stop()

    @property
    def peak_rss_gb(self) -> float:
        """The highest peak resident memory of any of its worker processes so far, in GiB (the run's summary: the
        trainer's own peak does not include them)."""
        return max([self._peak_mb] + [w.peak_mb() for w in self._workers]) / 1024

    def __enter__(self) -> "Grader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed:
                self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ------------------------------------------------------------------ internals

    def _local(self, response: str, answer: str) -> tuple[float, str]:
        try:
            assert self._local_fn is not None  # set when workers=0, the only case that grades here
            r, s = self._local_fn(response, answer)
            return float(r), str(s)
        except Exception:  # noqa: BLE001
            return 0.0, VERIFY_ERROR

    def _start(self) -> _Worker:
        if self._ctx is None:
            raise GraderError("a Grader with workers=0 starts no worker processes")
        try:
            return _Worker(self._ctx, self.verify_fn, self.startup_timeout_s, self.verify_kwargs)
        except Exception as e:  # noqa: BLE001
            raise GraderError(f"cannot start a grader worker process: {type(e).__name__}: {e}") from e

    def _replace(self, w: _Worker) -> None:
        self._peak_mb = max(self._peak_mb, w.peak_mb())
        w.kill()
        self._workers[self._workers.index(w)] = self._start()
        self.restarts += 1

    def _run(self, pending: deque[int], responses, answers, rewards, statuses, bar) -> None:
        """Hand out ``pending`` items to the workers until every item has a status."""
        tally = _Tally(pending, rewards, statuses, bar)
        while tally.remaining > 0:
            self._feed(pending, responses, answers)
            active = [w for w in self._workers if w.inflight or not w.ready]
            if not active:
                if not pending:
                    raise GraderError("internal error: items neither pending nor in flight")
                continue
            mp_wait([w.conn for w in active], timeout=max(0.0, min(w.deadline for w in active) - time.monotonic()))
            for w in active:  # every answer that has arrived, before judging deadlines
                self._drain(w, tally)
            self._expire(tally)

    def _feed(self, pending: deque[int], responses, answers) -> None:
        """Send idle ready workers their next chunk (chunked so that every worker gets a share)."""
        for w in self._workers:
            if w.ready and not w.inflight and pending:
                size = min(self.chunk_size, max(1, len(pending) // len(self._workers)))
                items = [pending.popleft() for _ in range(min(size, len(pending)))]
                try:
                    w.send([(i, responses[i], answers[i]) for i in items], self.timeout_s)
                except (OSError, ValueError):  # died while idle: resend elsewhere
                    pending.extendleft(reversed(items))
                    w.inflight.clear()
                    self._replace(w)

    def _drain(self, w: _Worker, tally: "_Tally") -> None:
        """Every message worker ``w`` has sent; a dead worker's current item fails and the rest go back."""
        try:
            while w.conn.poll():
                msg = w.conn.recv()
                if msg[0] == "ready":
                    w.ready = True
                elif msg[0] == "fatal":
                    raise GraderError(msg[1])
                else:
                    i, reward, status = msg
                    if w.inflight and w.inflight[0] == i:
                        w.inflight.popleft()
                        tally.finish(i, reward, status)
                    w.deadline = time.monotonic() + self.timeout_s
        except (EOFError, OSError):  # the worker died: its current item fails, unless the stop killed it
            if w.inflight and stopping() and w.inflight[0] not in tally.retried:
                tally.retried.add(w.inflight[0])  # graded again by a fresh worker: an interrupted item is never scored
            elif w.inflight:
                tally.finish(w.inflight.popleft(), 0.0, VERIFY_ERROR)
            tally.requeue(w)
            if not w.ready:
                w.proc.join(timeout=1.0)
                raise GraderError(
                    f"grader worker exited during start-up (exit code {w.proc.exitcode}); "
                    "a main module without an `if __name__ == '__main__':` guard causes this"
                ) from None
            self._replace(w)

    def _expire(self, tally: "_Tally") -> None:
        """Kill workers past their deadline: the item in hand times out, the rest go back."""
        now = time.monotonic()
        for w in list(self._workers):
            if now < w.deadline:
                continue
            if w.inflight:
                tally.finish(w.inflight.popleft(), 0.0, VERIFY_TIMEOUT)
                tally.requeue(w)
                self._replace(w)
            elif not w.ready:
                w.kill()
                raise GraderError(f"grader worker not ready after {self.startup_timeout_s:.0f}s")
