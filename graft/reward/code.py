"""Grading of the ``code`` domain in the grader's worker processes: the response's last fenced Python block
runs against the row's tests in the sandbox (:mod:`graft.reward.sandbox`).

The reference is the row's tests as JSON (:func:`code_reference`): ``{"tests": [...] or "test code",
"entry_point": "name" or null, "holdout": [...]}``; ``holdout`` (the built-in task's tests on fresh inputs of
the row's family, its ``fresh_tests``) never counts toward the reward. Status: ``ok`` when every test passed;
``holdout_fail`` when every test passed (reward 1) but a held-out test failed (the detector of programs that fit
the tests without solving the problem: ``holdout`` plus ``reward.holdout_tests`` of the row's own tests, which
then leave the reward); otherwise the kind of the first failure (``wrong_answer``, ``exception:NameError``,
``syntax``, ``program_timeout``, ``memory``, ``output_limit``, ``missing_result``), ``no_answer`` without a code
block, ``error`` when the sandbox itself failed or is weaker than bubblewrap without ``reward.allow_weak_sandbox``,
``interrupted`` (reward 0) when a stop signal reached the sandbox while it ran (the grader grades it again, once).
A program that runs out of time is the model's failure (``program_timeout``), never the grader's ``timeout``:
the grader's hard limit (``reward.timeout_s``) is kept above the program's own.

Light imports only (no torch): grader workers import this module.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping
from typing import Any

from graft.errors import UserError
from graft.reward import code_monitor, sandbox, verifier
from graft.success import succeeded

PROGRAM_MARGIN_S = 1.5
"""Seconds of ``reward.timeout_s`` kept for starting the sandbox and reading its answer, so that a program that
uses all of its own time is reported as ``program_timeout`` before the grader's hard limit."""

HOLDOUT_FAIL = "holdout_fail"
"""The status (and monitor flag) of a rewarded program that fails a held-out test."""

STRONG = "bwrap"
"""The isolation the code domain requires unless ``reward.allow_weak_sandbox`` is set."""


class SandboxUnavailable(UserError, RuntimeError):
    """The code domain cannot isolate programs as required here (one line: what is missing, how to get it)."""


def code_reference(row: Mapping[str, Any]) -> str:
    """The reference of a code row: its ``tests`` (a list of test strings, or one string of test code),
    ``entry_point`` and, when the row has them (the built-in task), its ``fresh_tests`` as ``holdout``, as JSON;
    a row without usable tests raises ``ValueError`` (the caller's row error)."""
    raw = row.get("tests")
    tests: str | list[str]
    if isinstance(raw, str) and raw.strip():
        tests = raw
    elif isinstance(raw, (list, tuple)) and len(raw) > 0 and all(isinstance(t, str) and t.strip() for t in raw):
        tests = list(raw)
    else:
        raise ValueError(f"tests must be a non-empty list of test strings or one string of test code, got {raw!r:.60}")
    entry = row.get("entry_point")
    sandbox.parse_tests(tests, entry)  # an unparsable test is the row's fault, said when the data is read
    out: dict[str, Any] = {"tests": tests, "entry_point": entry}
    fresh = row.get("fresh_tests")
    if fresh:
        if not isinstance(fresh, (list, tuple)) or not all(isinstance(t, str) for t in fresh):
            raise ValueError(f"fresh_tests must be a list of test strings, got {fresh!r:.60}")
        sandbox.parse_tests(list(fresh), entry)
        out["holdout"] = list(fresh)
    return json.dumps(out)


def check_isolation(allow_weak: bool) -> str:
    """The sandbox's isolation (:func:`graft.reward.sandbox.isolation`), or :class:`SandboxUnavailable` when it is
    weaker than bubblewrap and ``allow_weak`` is not set, or when nothing works."""
    got = sandbox.isolation()
    if got == STRONG or (allow_weak and not got.startswith("none")):
        return got
    why = sandbox.problem(STRONG)
    if allow_weak:
        raise SandboxUnavailable(f"reward.domain=code: no sandbox works here ({got})")
    raise SandboxUnavailable(
        f"reward.domain=code runs model-written programs and needs bubblewrap to isolate them, but {why}: install it "
        "(apt-get install bubblewrap, dnf install bubblewrap, or scripts/install.sh), or set "
        "reward.allow_weak_sandbox=true to accept a weaker sandbox (docs/your-task.md says what it exposes)"
    )


def describe_isolation(reward: Any) -> str:
    """The line a run prints and records about its sandbox (``reward`` a :class:`graft.config.RewardConfig`);
    raises :class:`SandboxUnavailable` as :func:`check_isolation`."""
    got = check_isolation(reward.allow_weak_sandbox)
    if got == STRONG:
        return "code programs run in the bwrap sandbox (no network, read-only system, no graft, a call per process)"
    return f"code programs run in the WEAK {got} sandbox (reward.allow_weak_sandbox=true; docs/your-task.md)"


def warm_up() -> None:
    """Run the sandbox's one-off self-test (which isolation works here) before the first item's clock starts."""
    sandbox.isolation()


def split_holdout(tests: list[sandbox.TestCase], n: int) -> tuple[list[sandbox.TestCase], list[sandbox.TestCase]]:
    """``n`` of ``tests`` held out of the reward (at most all but one), chosen by a seed drawn from the tests
    themselves (the same split in every grading): ``(counted, held_out)``, each in the tests' order."""
    n = min(n, len(tests) - 1)
    if n <= 0:
        return tests, []
    seed = int.from_bytes(hashlib.sha256(repr([(t.call, t.expected, t.code) for t in tests]).encode()).digest()[:8], "big")
    held = set(random.Random(seed).sample(range(len(tests)), n))
    return [t for i, t in enumerate(tests) if i not in held], [t for i, t in enumerate(tests) if i in held]


def _reward(passed: int, total: int, partial_credit: bool) -> float:
    """The reward of a program that passed ``passed`` of ``total`` counted tests: 1 when it passed them all, else the
    share passed with ``partial_credit`` and 0 without."""
    return 1.0 if passed == total else passed / max(total, 1) if partial_credit else 0.0


def rewarded_from(total: int, partial_credit: bool, threshold: float) -> int:
    """The fewest of ``total`` counted tests a program must pass for its reward to be a success (above ``threshold``):
    the held-out tests run from there on (``total + 1``: never). Hand-worked: 4 tests with partial credit at 0.5 ->
    3 (2/4 = 0.5 is not above 0.5, 3/4 is); at 0.25 -> 2; without partial credit -> 4."""
    return next((k for k in range(total + 1) if succeeded(_reward(k, total, partial_credit), threshold)), total + 1)


def verify_code(
    response: str,
    reference: str,
    partial_credit: bool = False,
    timeout_s: float = 5.0,
    test_timeout_s: float = 3.0,
    memory_mb: int = 512,
    holdout_tests: int = 0,
    allow_weak_sandbox: bool = False,
    *,
    success_threshold: float,
) -> tuple[float, str]:
    """Reward and status of one response (module doc). ``partial_credit``: the share of the counted tests passed.
    The held-out tests run after the counted ones, only for a program the reward calls rewarded (a reward above
    ``success_threshold``, ``reward.success_threshold``: :func:`rewarded_from`), so they never change the reward."""
    program = code_monitor.extract_program(response)
    if not program or not program.strip():
        return 0.0, verifier.NO_ANSWER
    try:
        check_isolation(allow_weak_sandbox)
    except SandboxUnavailable:
        return 0.0, verifier.ERROR
    ref = json.loads(reference)
    entry = ref.get("entry_point")
    tests, held = split_holdout(sandbox.parse_tests(ref["tests"], entry), holdout_tests)
    if ref.get("holdout"):
        held += sandbox.parse_tests(ref["holdout"], entry)
    result = sandbox.run_tests(
        program,
        tests,
        extra=held,
        extra_after=rewarded_from(len(tests), partial_credit, success_threshold),
        timeout_s=max(1.0, timeout_s - PROGRAM_MARGIN_S),
        test_timeout_s=test_timeout_s,
        memory_mb=memory_mb,
    )
    if result.interrupted:
        return 0.0, verifier.INTERRUPTED
    if result.status == "error":
        return 0.0, verifier.ERROR
    reward = _reward(result.passed, result.total, partial_credit)
    if succeeded(reward, success_threshold) and result.extra_total and result.extra_failure is not None:
        return reward, HOLDOUT_FAIL
    if result.passed == result.total and result.failure is None:
        return 1.0, verifier.OK
    kind = result.failure or "wrong_answer"
    return reward, "program_timeout" if kind == "timeout" else kind
