"""The hidden tests of a program and how an answer is judged: a row's ``assert NAME(ARGS) == LITERAL`` lines parsed
into :class:`TestCase` s (call and expected value apart, so the expected values never enter the sandbox), and the
strict comparison of a returned value with the expected literal (:func:`same`). :mod:`graft.reward.sandbox` runs the
calls; this module decides what counts as passing.
"""

from __future__ import annotations

import ast
import cmath
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TestCase:
    """One test: ``call`` (an expression evaluated in the program's namespace) whose value must equal
    ``expected`` (a Python literal; compared outside the sandbox), or ``code`` (test code run inside the
    sandbox; passes when it raises nothing)."""

    __test__ = False  # not a pytest class

    call: str = ""
    expected: object | None = None
    code: str | None = None

    def __post_init__(self) -> None:
        if (self.code is None) == (not self.call):
            raise ValueError("a TestCase has either a call (with its expected value) or code, not both or neither")


def parse_tests(tests: str | list[str], entry_point: str | None = None) -> list[TestCase]:
    """Turn a row's tests into TestCases. A source whose statements are all asserts becomes split tests:
    ``assert CALL == LITERAL`` (or ``LITERAL == CALL``) -> TestCase(CALL, LITERAL); ``assert not CALL`` ->
    expected False; any other ``assert CALL`` -> expected True (the value must equal True, not just be
    truthy). Any other source (imports, helpers, HumanEval's ``def check(candidate): ...``) is one
    TestCase(code=...); when it defines ``check`` and does not call it, ``check(entry_point)`` is
    appended. Raises ValueError with a one-line message on unparsable tests."""
    sources = [tests] if isinstance(tests, str) else list(tests)
    if not sources:
        raise ValueError("no tests")
    out: list[TestCase] = []
    for source in sources:
        if not isinstance(source, str):
            raise ValueError(f"a test must be a string, got {type(source).__name__}")
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError) as e:
            raise ValueError(f"unparsable test {one_line(source)!r}: {getattr(e, 'msg', e)}") from None
        if not tree.body:
            raise ValueError(f"empty test {one_line(source)!r}")
        split = [_split_assert(node) for node in tree.body]
        asserts = [case for case in split if case is not None]
        if len(asserts) == len(split):
            out.extend(asserts)
        else:
            out.append(TestCase(code=_test_code(source, tree, entry_point)))
    return out


def one_line(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _literal(node: ast.AST) -> tuple[bool, object]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _split_assert(node: ast.stmt) -> TestCase | None:
    if not isinstance(node, ast.Assert):
        return None
    test = node.test
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        for call, lit in ((test.left, test.comparators[0]), (test.comparators[0], test.left)):
            ok, value = _literal(lit)
            if ok and not _literal(call)[0]:
                return TestCase(ast.unparse(call), value)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and not _literal(test.operand)[0]:
        return TestCase(ast.unparse(test.operand), False)
    if _literal(test)[0]:
        return None  # `assert True`: nothing to split
    return TestCase(ast.unparse(test), True)


def _test_code(source: str, tree: ast.Module, entry_point: str | None) -> str:
    defines_check = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "check" for n in tree.body)
    calls_check = any(
        isinstance(n, ast.Expr)
        and isinstance(n.value, ast.Call)
        and isinstance(n.value.func, ast.Name)
        and n.value.func.id == "check"
        for n in tree.body
    )
    if not defines_check or calls_check:
        return source
    if not entry_point or not entry_point.isidentifier():
        raise ValueError(f"test code defines check(candidate) but entry_point is {entry_point!r}")
    return f"{source}\n\ncheck({entry_point})\n"


FLOAT_REL_TOL, FLOAT_ABS_TOL = 1e-9, 1e-12
"""The tolerance of a float (or complex) expected value: ``math.isclose(expected, got, rel_tol, abs_tol)``."""


def canon(value: object) -> object:
    """A hashable form of a literal in which values of different types differ (``True`` vs ``1``, ``1`` vs ``1.0``)."""
    if isinstance(value, tuple):
        return ("tuple", tuple(canon(v) for v in value))
    if isinstance(value, frozenset):
        return ("frozenset", frozenset(canon(v) for v in value))
    return (type(value).__name__, value)


def same(expected: object, got: object) -> bool:
    """Strict equality of two literals, at any depth: the types must be the same (``True != 1``, ``92.0 != 92``,
    ``[1] != (1,)``), floats and complex numbers equal within ``FLOAT_REL_TOL``/``FLOAT_ABS_TOL``, dict keys and set
    elements compared by :func:`canon`."""
    if type(expected) is not type(got):
        return False
    if isinstance(expected, float):
        return math.isclose(expected, got, rel_tol=FLOAT_REL_TOL, abs_tol=FLOAT_ABS_TOL)  # type: ignore[arg-type]
    if isinstance(expected, complex):
        return cmath.isclose(expected, got, rel_tol=FLOAT_REL_TOL, abs_tol=FLOAT_ABS_TOL)  # type: ignore[arg-type]
    if isinstance(expected, (list, tuple)):
        return len(got) == len(expected) and all(same(e, g) for e, g in zip(expected, got, strict=True))  # type: ignore[arg-type, call-overload]
    if isinstance(expected, dict):
        theirs = {canon(k): v for k, v in got.items()}  # type: ignore[attr-defined]
        return len(theirs) == len(expected) and all(canon(k) in theirs and same(v, theirs[canon(k)]) for k, v in expected.items())
    if isinstance(expected, (set, frozenset)):
        return {canon(v) for v in expected} == {canon(v) for v in got}  # type: ignore[attr-defined]
    return bool(expected == got)


def exception_kind(name: object, code_test: bool) -> str:
    name = name if isinstance(name, str) and name.isidentifier() and len(name) <= 80 else "Unknown"
    if name == "MemoryError":
        return "memory"
    if code_test and name == "AssertionError":
        return "wrong_answer"
    return f"exception:{name}"


def outcome(test: TestCase, tag: str, payload: object) -> str | None:
    """None (passed) or the failure kind of one reported test."""
    if tag == "O":
        return "timeout"
    if tag == "E":
        return exception_kind(payload, test.code is not None)
    if test.code is not None:
        return None if tag == "T" else "wrong_answer"
    if tag != "V" or not isinstance(payload, str):
        return "wrong_answer"
    try:
        value = ast.literal_eval(payload)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return "wrong_answer"
    return None if same(test.expected, value) else "wrong_answer"
