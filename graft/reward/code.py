"""Grading of the ``code`` domain in the grader's worker processes: the response's last fenced Python block
runs against the row's tests in the sandbox (:mod:`graft.reward.sandbox`).

The reference is the row's tests as JSON (:func:`code_reference`): ``{"tests": [...] or "test code",
"entry_point": "name" or null}``. Status: ``ok`` when every test passed; otherwise the kind of the first failure
(``wrong_answer``, ``exception:NameError``, ``syntax``, ``program_timeout``, ``memory``, ``output_limit``,
``missing_result``), ``no_answer`` without a code block, ``error`` when the sandbox itself failed. A program that
runs out of time is the model's failure (``program_timeout``), never the grader's ``timeout``: the grader's hard
limit (``reward.timeout_s``) is kept above the program's own.

Light imports only (no torch): grader workers import this module.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from graft.reward import code_monitor, sandbox, verifier

PROGRAM_MARGIN_S = 1.5
"""Seconds of ``reward.timeout_s`` kept for starting the sandbox and reading its answer, so that a program that
uses all of its own time is reported as ``program_timeout`` before the grader's hard limit."""


def code_reference(row: Mapping[str, Any]) -> str:
    """The reference of a code row: its ``tests`` (a list of test strings, or one string of test code) and
    ``entry_point``, as JSON; a row without usable tests raises ``ValueError`` (the caller's row error)."""
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
    return json.dumps({"tests": tests, "entry_point": entry})


def warm_up() -> None:
    """Run the sandbox's one-off self-test (which isolation works here) before the first item's clock starts."""
    sandbox.isolation()


def verify_code(
    response: str,
    reference: str,
    partial_credit: bool = False,
    timeout_s: float = 5.0,
    test_timeout_s: float = 3.0,
    memory_mb: int = 512,
) -> tuple[float, str]:
    """Reward and status of one response (module doc). ``partial_credit``: the share of tests passed."""
    program = code_monitor.extract_program(response)
    if not program or not program.strip():
        return 0.0, verifier.NO_ANSWER
    ref = json.loads(reference)
    tests = sandbox.parse_tests(ref["tests"], ref.get("entry_point"))
    result = sandbox.run_tests(
        program, tests, timeout_s=max(1.0, timeout_s - PROGRAM_MARGIN_S), test_timeout_s=test_timeout_s, memory_mb=memory_mb
    )
    if result.status == "error":
        return 0.0, verifier.ERROR
    total = max(result.total, 1)
    if result.passed == result.total and result.failure is None:
        return 1.0, verifier.OK
    reward = result.passed / total if partial_credit else 0.0
    kind = result.failure or "wrong_answer"
    return reward, "program_timeout" if kind == "timeout" else kind
