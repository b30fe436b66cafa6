"""Issue 39: with ``threads_claim_freed`` the models still running in a side-by-side phase take the threads of the
ones that finished (:mod:`graft.cores`): in-process at every :func:`graft.cores.poll`, on Ray before each worker
call (``set_threads`` on every rank)."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from graft import cores
from graft.config import ConfigError
from graft.policy.sampling import SamplingParams
from graft.trainer import loop
from graft.trainer.learner import Learner, generation_rounds
from graft.trainer.workers import PolicyWorker
from tests.trainer.helpers import crafted_rewards, params, tiny_config

WAIT_S = 30


def _fake_run(names=("A", "B"), claim=True, **threads_per_model) -> SimpleNamespace:
    cfg = SimpleNamespace(threads_per_model=threads_per_model, threads_claim_freed=claim)
    return SimpleNamespace(cfg=cfg, learners=dict.fromkeys(names))


def _in_thread(fn):
    """``fn()`` on a thread of its own (so this thread's torch thread count stays as it is); its result."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(WAIT_S)
    return out[0]


def _poll_until(threads: int) -> list[int]:
    """Poll until the calling thread runs on ``threads`` torch threads (at most WAIT_S); every count seen."""
    seen, deadline = [torch.get_num_threads()], time.monotonic() + WAIT_S
    while seen[-1] < threads and time.monotonic() < deadline:
        cores.poll()
        if torch.get_num_threads() != seen[-1]:
            seen.append(torch.get_num_threads())
        time.sleep(0.001)
    return seen


# ----------------------------------------------------------------------------- hand-worked


def test_the_second_of_two_tasks_takes_the_firsts_thread_at_its_next_poll():
    share = cores.Share(["A", "B"], 1)
    b_started, a_done, seen = threading.Event(), threading.Event(), []

    def a():
        b_started.wait(WAIT_S)
        with cores.claiming(share, "A"):
            seen.append(("A", torch.get_num_threads()))
        a_done.set()

    def b():
        with cores.claiming(share, "B"):
            cores.poll()
            seen.append(("B", torch.get_num_threads()))   # A still running: 1
            b_started.set()
            a_done.wait(WAIT_S)
            seen.append(("B before poll", torch.get_num_threads()))   # A's thread is B's, not taken yet
            cores.poll()
            seen.append(("B after poll", torch.get_num_threads()))   # 1 + A's 1 = 2

    threads = [threading.Thread(target=f) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert seen == [("B", 1), ("A", 1), ("B before poll", 1), ("B after poll", 2)]
    assert share.threads("A") == share.threads("B") == 0   # both finished


def test_per_model_gives_the_slower_model_the_freed_thread():
    started = threading.Barrier(2, timeout=WAIT_S)

    def fn(name):
        started.wait()
        return [torch.get_num_threads()] if name == "A" else _poll_until(2)

    before = torch.get_num_threads()
    out = loop.per_model(_fake_run(rollout=1), "rollout", fn)
    assert out == {"A": [1], "B": [1, 2]} and torch.get_num_threads() == before


def test_three_tasks_split_the_freed_threads_remainder_to_the_earliest():
    share = cores.Share(["A", "B", "C"], 3)   # 9 threads, 3 each
    share.release("A")   # A's 3 over B, C: 3 // 2 = 1 each, the remainder 1 to B (earlier) -> B 3+2=5, C 3+1=4
    assert (share.threads("B"), share.threads("C")) == (5, 4)
    share.release("C")   # C's 4 all to B: 5 + 4 = 9, every thread of the phase
    assert (share.threads("A"), share.threads("B"), share.threads("C")) == (0, 9, 0)
    share.release("B")
    assert share.threads("B") == 0

    share = cores.Share(["A", "B", "C"], 1)
    share.release("B")   # B's 1 over A, C: 1 // 2 = 0 each, the remainder 1 to A -> A 2, C 1
    assert (share.threads("A"), share.threads("C")) == (2, 1)


def test_split_keeps_every_thread_and_is_even_to_within_one():
    assert cores.split(3, ["B", "C"]) == {"B": 2, "C": 1}
    assert cores.split(1, ["B", "C"]) == {"B": 1, "C": 0}
    assert cores.split(4, ["B", "C"]) == {"B": 2, "C": 2}
    for freed in range(10):
        for r in range(1, 5):
            got = cores.split(freed, [f"m{i}" for i in range(r)])
            assert sum(got.values()) == freed and max(got.values()) - min(got.values()) <= 1
            assert list(got.values()) == sorted(got.values(), reverse=True)


def test_three_models_side_by_side_each_end_on_what_the_rule_gives():
    """A returns at once, B once it has 2 threads (after A: B 1 + 1), C once it has 3 (after B: 1 + 2)."""
    started = threading.Barrier(3, timeout=WAIT_S)

    def fn(name):
        started.wait()
        return {"A": lambda: [torch.get_num_threads()], "B": lambda: _poll_until(2), "C": lambda: _poll_until(3)}[name]()

    out = loop.per_model(_fake_run(("A", "B", "C"), update=1), "update", fn)
    assert out == {"A": [1], "B": [1, 2], "C": [1, 3]}


# ----------------------------------------------------------------------------- invariants


def test_poll_outside_a_side_by_side_task_changes_nothing():
    def outside():
        torch.set_num_threads(3)
        cores.poll()
        return torch.get_num_threads()

    assert _in_thread(outside) == 3
    before = torch.get_num_threads()
    cores.poll()
    assert torch.get_num_threads() == before


def test_without_claiming_per_model_behaves_as_before():
    a_done, seen = threading.Event(), {}

    def fn(name):
        if name == "A":
            a_done.set()
            return torch.get_num_threads()
        a_done.wait(WAIT_S)
        time.sleep(0.05)
        cores.poll()
        return torch.get_num_threads()

    out = loop.per_model(_fake_run(claim=False, rollout=1), "rollout", fn)
    assert out == {"A": 1, "B": 1}
    out = loop.per_model(_fake_run(claim=True, rollout=1), "update", lambda n: seen.setdefault(n, threading.get_ident()))
    assert set(seen.values()) == {threading.get_ident()}   # no threads_per_model.update: in order, here


def test_the_task_releases_its_threads_when_it_raises():
    share = cores.Share(["A", "B"], 2)

    def fail():
        with pytest.raises(ValueError), cores.claiming(share, "A"):
            raise ValueError("A failed")
        return share.threads("B")

    assert _in_thread(fail) == 4


# ----------------------------------------------------------------------------- Ray: the driver side


class _FakeWorkers:
    """Two ranks recording every call; ``on_generate`` runs at each ``generate`` (another model finishing)."""

    def __init__(self, on_generate=lambda: None):
        self.size, self.calls, self.on_generate = 2, [], on_generate

    def call(self, method, args, what=""):
        assert len(args) == self.size
        if method == "generate":
            self.calls.append(("generate", [len(a[0]) for a in args]))
            self.on_generate()
            return [[[f"p{len(a[0])}"] for _ in a[0]] for a in args]
        self.calls.append((method, [a[0] for a in args]))
        return [None] * self.size


def _learner(workers) -> Learner:
    return Learner(SimpleNamespace(name="B", kl_coef=0.0), workers, codec=None)


def test_generation_rounds_take_one_batch_per_rank_at_a_time():
    assert generation_rounds([[0, 1, 2, 3, 4], [5, 6]], 2) == [[[0, 1], [5, 6]], [[2, 3], []], [[4], []]]
    assert generation_rounds([[], []], 2) == []


def test_ray_workers_get_the_grown_count_before_their_next_call_and_their_own_after():
    share = cores.Share(["A", "B"], 1)
    workers = _FakeWorkers(on_generate=lambda: share.threads("A") and share.release("A"))   # A ends during round 1

    def b():
        with cores.claiming(share, "B"):
            # 8 prompts, n=2, batch_size=4: 2 prompts per generation batch, ranks [0..3] and [4..7], 2 rounds
            return _learner(workers).generate([[1]] * 8, SamplingParams(n=2, max_new_tokens=1, batch_size=4, seeds=range(8)))

    out = _in_thread(b)
    assert len(out) == 8
    assert workers.calls == [
        ("generate", [2, 2]),
        ("set_threads", [2, 2]),   # B's 1 + A's 1, on both ranks, before the next call
        ("generate", [2, 2]),
        ("set_threads", [None, None]),   # back on their own threads after the phase's calls
    ]


def test_ray_workers_outside_a_side_by_side_task_get_one_call_as_before():
    workers = _FakeWorkers()
    _learner(workers).generate([[1]] * 8, SamplingParams(n=2, max_new_tokens=1, batch_size=4, seeds=range(8)))
    assert workers.calls == [("generate", [4, 4])]


def test_a_worker_sets_its_threads_and_goes_back_to_its_own():
    def worker_threads():
        torch.set_num_threads(1)
        w = PolicyWorker("A")
        w.set_threads(3)
        grown = torch.get_num_threads()
        w.set_threads(None)
        return grown, torch.get_num_threads()

    assert _in_thread(worker_threads) == (3, 1)


# ----------------------------------------------------------------------------- config and end to end


def test_claiming_without_threads_per_model_is_refused_at_load(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    with pytest.raises(ConfigError, match="threads_claim_freed") as e:
        tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "threads_claim_freed=true")
    assert "threads_per_model" in str(e.value)
    tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "threads_claim_freed=true", "threads_per_model.update=1")


def _one_step(tmp_path, tiny_llama_dir, tiny_gemma_dir, *overrides) -> tuple[dict, dict]:
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "threads=1", "threads_per_model.rollout=1",
                      "threads_per_model.update=1", *overrides)
    run = loop.setup(cfg)
    try:
        row = loop.train_step(run, 1)
        p = params(run)
    finally:
        loop.close_run(run)
    timing = ("time/", "tokens_per_s/", "mem/")
    return {k: v for k, v in row.items() if not any(t in k for t in timing)}, p


def _recording_claims(monkeypatch) -> list[tuple[str, int, int]]:
    """``(model, threads before, after)`` of every poll that raised a task's threads, from now on."""
    grown, apply = [], cores._apply

    def recorded(task):
        before = task.applied
        apply(task)
        if task.applied > before:
            grown.append((task.name, before, task.applied))

    monkeypatch.setattr(cores, "_apply", recorded)
    return grown


@pytest.mark.slow
def test_a_step_claiming_freed_threads_matches_the_step_without(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    crafted_rewards(monkeypatch)
    row, p = _one_step(tmp_path / "plain", tiny_llama_dir, tiny_gemma_dir)
    grown = _recording_claims(monkeypatch)
    row_c, p_c = _one_step(tmp_path / "claim", tiny_llama_dir, tiny_gemma_dir, "threads_claim_freed=true")
    assert ("B", 1, 2) in grown   # tiny Gemma's 262k-row head makes B the slower model: it takes A's thread
    assert row_c.keys() == row.keys()
    for k, v in row.items():
        assert row_c[k] == (pytest.approx(v, rel=1e-4, abs=1e-6, nan_ok=True) if isinstance(v, float) else v), k
    assert p_c.keys() == p.keys()
    assert all(torch.allclose(p_c[k], p[k], atol=1e-6) for k in p)
