"""Grader: hard per-item timeout in worker processes, crash recovery, parity with verify()."""
import threading
import time

import pytest

from graft.reward.grader import Grader, GraderError
from graft.reward.verifier import verify

from . import grader_hooks

# Workers import the hook by name with the parent's sys.path, so use the name it got here.
HOOK = f"{grader_hooks.__name__}:hang_on_marker"
OVERHEAD_S = 4.0  # process restart + scheduling on a loaded 2-core machine


@pytest.fixture(scope="module")
def hook_grader():
    with Grader(timeout_s=1.0, workers=1, verify_fn=HOOK) as g:
        g.grade([r"\boxed{1}"], ["1"])  # start-up (forkserver, first worker) outside the timed tests
        yield g


def test_hanging_item_times_out_and_the_rest_still_grade(hook_grader):
    g = hook_grader
    restarts, timeouts = g.restarts, g.stats["timeout"]
    responses = [r"\boxed{HANG}", r"\boxed{\frac{1}{2}}", r"\boxed{0.5}", r"\boxed{3}"]
    t0 = time.monotonic()
    rewards, statuses = g.grade(responses, ["0.5"] * 4)
    elapsed = time.monotonic() - t0
    assert statuses == ["timeout", "ok", "ok", "ok"]
    assert rewards == [0.0, 1.0, 1.0, 0.0]
    assert elapsed < 1.0 + OVERHEAD_S
    assert g.restarts == restarts + 1 and g.stats["timeout"] == timeouts + 1
    # the replacement worker keeps grading
    assert g.grade([r"\boxed{2}"], ["2"]) == ([1.0], ["ok"])


def test_crash_and_exception_cost_only_their_item(hook_grader):
    responses = [r"\boxed{1}", r"\boxed{CRASH}", r"\boxed{RAISE}", r"\boxed{2/2}"]
    rewards, statuses = hook_grader.grade(responses, ["1"] * 4)
    assert statuses == ["ok", "error", "error", "ok"]
    assert rewards == [1.0, 0.0, 0.0, 1.0]


def test_timeout_works_from_a_non_main_thread(hook_grader):
    out = []
    th = threading.Thread(target=lambda: out.append(hook_grader.grade([r"\boxed{HANG}", r"\boxed{x}"], ["x", "x"])))
    t0 = time.monotonic()
    th.start()
    th.join(timeout=1.0 + 2 * OVERHEAD_S)
    assert not th.is_alive()
    assert out == [([0.0, 1.0], ["timeout", "ok"])]
    assert time.monotonic() - t0 < 1.0 + OVERHEAD_S


def test_parallel_hangs_do_not_add_up():
    with Grader(timeout_s=1.0, workers=2, verify_fn=HOOK) as g:
        g.grade([r"\boxed{1}"] * 2, ["1"] * 2)
        t0 = time.monotonic()
        _, statuses = g.grade([r"\boxed{HANG}", r"\boxed{HANG}", r"\boxed{5}"], ["5"] * 3)
        assert statuses == ["timeout", "timeout", "ok"]
        assert time.monotonic() - t0 < 1.0 + OVERHEAD_S


def test_workers_match_in_process_verify_and_keep_order():
    cases = [(r"\boxed{\frac{1}{2}}", "0.5"), (r"\boxed{8.7 \times 10^8}", "8.7e8"), ("no box", "3"),
             (r"\boxed{(-\infty, 2)}", r"(-\infty,2)"), (r"\boxed{(-\infty, 2]}", r"(-\infty,2)"),
             (r"\boxed{025}", "25"), (r"\boxed{\text{Evelyn}}", r"\text{Evelyn}"), (r"\boxed{x^2}", "x^3")] * 5
    responses, answers = [c[0] for c in cases], [c[1] for c in cases]
    expected = [verify(r, a) for r, a in cases]
    with Grader(timeout_s=10.0, workers=2, chunk_size=3) as g:
        rewards, statuses = g.grade(responses, answers, progress=True)
        assert list(zip(rewards, statuses)) == expected
        assert sum(g.stats.values()) == len(cases)
        assert g.stats["no_answer"] == 5 and g.stats["timeout"] == 0
    with Grader(workers=0) as g0:  # in-process: same results, no processes
        assert g0.grade(responses, answers) == (rewards, statuses)


def test_integer_answers_are_graded_without_a_round_trip():
    with Grader(timeout_s=5.0, workers=1) as g:
        t0 = time.monotonic()
        rewards, statuses = g.grade([rf"\boxed{{{i}}}" for i in range(2000)], [str(i % 1000) for i in range(2000)])
        assert time.monotonic() - t0 < 2.0
        assert sum(rewards) == 1000 and set(statuses) == {"ok"}


def test_bad_verify_fn_fails_fast():
    g = Grader(timeout_s=1.0, workers=1, verify_fn=f"{grader_hooks.__name__}:no_such_function")
    with pytest.raises(GraderError, match="no_such_function"):
        g.grade([r"\boxed{1}"], ["1"])
    with pytest.raises(GraderError, match="closed"):
        g.grade([r"\boxed{1}"], ["1"])


def test_close_stops_workers_and_rejects_use():
    g = Grader(timeout_s=1.0, workers=2)
    procs = [w.proc for w in g._workers]
    g.close()
    g.close()  # idempotent
    assert all(not p.is_alive() for p in procs)
    with pytest.raises(GraderError):
        g.grade([r"\boxed{1}"], ["1"])
    with pytest.raises(ValueError):
        Grader(workers=0).grade(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="fork"):
        Grader(workers=1, start_method="fork")


def test_spawn_start_method_works():
    with Grader(timeout_s=1.0, workers=1, verify_fn=HOOK, start_method="spawn") as g:
        assert g.grade([r"\boxed{HANG}", r"\boxed{4}"], ["4", "4"]) == ([0.0, 1.0], ["timeout", "ok"])


def test_the_workers_peak_memory_is_kept_for_the_summary():
    g = Grader(timeout_s=5.0, workers=1)
    g.grade(["\\boxed{x^2}"], ["x**2"])
    live = g.peak_rss_gb
    g.close()
    assert 0 < live <= g.peak_rss_gb < 4      # read from /proc before the worker stops


@pytest.mark.parametrize("stopping", [False, True], ids=["running", "stopping"])
def test_an_item_whose_worker_dies_during_a_stop_is_graded_again_not_scored(tmp_path, stopping):
    """A worker that dies while the process is stopping (graft.signals.stopping) died of the stop, not of its item:
    the item is handed out again and gets its true grade; at any other time it is an error, as before."""
    import os
    import signal

    from graft.signals import StopSignal

    g = Grader(timeout_s=10.0, workers=1, verify_fn="tests.reward.grader_hooks:crash_once")
    with StopSignal() as stop:
        if stopping:
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.requested == "SIGTERM"
        rewards, statuses = g.grade([f"ONCE:{tmp_path / 'm'} \\boxed{{2}}", "\\boxed{3}"], ["2", "3"])
    g.close()
    assert (rewards, statuses) == (([1.0, 1.0], ["ok", "ok"]) if stopping else ([0.0, 1.0], ["error", "ok"]))


@pytest.mark.parametrize("workers", [1, 0])
def test_an_item_answered_interrupted_is_graded_again_once(tmp_path, workers):
    """A verify function answering ``interrupted`` (a stop reached the code sandbox) gets the item again, once: an item
    interrupted once gets its true grade (2 gradings); one interrupted every time keeps the status (2 gradings, not
    more); the others are graded once."""
    g = Grader(timeout_s=10.0, workers=workers, verify_fn="tests.reward.grader_hooks:interrupted_until")
    once, always, plain = tmp_path / "once", tmp_path / "always", tmp_path / "plain"
    responses = [f"STOP:1:{once} \\boxed{{2}}", f"STOP:9:{always} \\boxed{{3}}", f"STOP:0:{plain} \\boxed{{4}}", "\\boxed{5}"]
    rewards, statuses = g.grade(responses, ["2", "3", "4", "6"])
    g.close()
    assert (rewards, statuses) == ([1.0, 0.0, 1.0, 0.0], ["ok", "interrupted", "ok", "ok"])
    assert [p.read_text() for p in (once, always, plain)] == ["xx", "xx", "x"]
