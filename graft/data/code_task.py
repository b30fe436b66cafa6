"""The ``code`` domain's embedded task: seeded procedural problems asking for one small Python function.

``make_code_task(1, 0, ["add"])[0]`` is a row such as::

    {"id": "add-00000",
     "problem": "Write a Python function `add_50(x)` that returns x plus 50. For example, add_50(97) returns 147.",
     "tests": ["assert add_50(0) == 50", "assert add_50(-50) == 0", "assert add_50(-1) == 49", ...],
     "fresh_tests": ["assert add_50(-6613) == -6563", ...],
     "entry_point": "add_50"}

(hand-checked: 97 + 50 = 147 in the text; 0 + 50 = 50 and -50 + 50 = 0 in the tests). A row asks for ONE function,
states precisely what it returns and shows ONE example call with its result. Its ``tests`` are hidden unit tests of
exactly the form ``assert NAME(ARGS) == LITERAL`` (literal arguments, literal expected value: a grader splits each
into call and expected value, and the expected values never enter the sandbox), on inputs that differ from the
example's and from each other. ``fresh_tests`` are more of the same on inputs drawn afresh from the family (a
separate random stream): they never count toward the reward; the grader runs them on rewarded programs only, to
detect a program that fits the tests without solving the problem (status and monitor flag ``holdout_fail``).
Expected values come from the reference implementation of each family (:attr:`CodeSpec.ref`, plain Python);
:func:`solution` gives the separately written reference *source* (a correct response), and the tests check that
the two agree.

**What the tests cover.** Each family lists its input classes in priority order (:attr:`CodeSpec.edges`): the
boundaries and edge inputs of its specification, each one deliberately (zero, one and minus one, negatives, each
bound and its neighbours, the remainders next to a multiple, empty, one- and two-element inputs, long inputs past
100 characters or items, values past 10**8 (10**6 where a correct program may loop once per unit), repeated values
side by side, an order that is not sorted, spaces and digits in strings, and the inputs on which known near misses
go wrong; see each family's ``edges``). A row's first tests are those classes (values drawn for each), then random
inputs from the whole input space (:attr:`CodeSpec.draw`) fill ``tests_per_prompt``. The number of tests was chosen
by measuring how many wrong programs of a committed mutant suite they reject (tests/data/code_mutants.py,
``results/code/kill_rates.md``), not by feel.

Families (:data:`graft.registry.CODE_FAMILIES`, registered in :mod:`graft.data.code_families`) draw their constants,
so a family has many distinct functions: ``add_7`` and ``add_12`` are two problems of ``add``. The function name
carries the constants (``clamp_3_20``, ``count_e``), so one name always means one specification, in every draw.
Families whose function is fixed (``transform``'s ``reverse_string``, ``palindrome``, ...) vary by the example and the
tests only.

Like :mod:`graft.data.arithmetic`: ``random.Random(seed)`` with integer draws only (``randint``, ``randrange``,
``choice``, ``shuffle``), so the same arguments give the same rows, ids and order on every run and platform. The
instruction to answer in a fenced ```python block belongs to the prompt template, not here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from graft.config.checks import check
from graft.data.code_families import Args, CodeSpec
from graft.data.tasks import Task, family_of
from graft.registry import CODE_FAMILIES, TASKS

DEFAULT_FAMILIES: tuple[str, ...] = tuple(f for f in CODE_FAMILIES if f != "factorial")
"""Every family but ``factorial`` (8 examples, so only 8 distinct problems: it cannot fill a large task)."""

TESTS_PER_PROMPT = 12
"""The default number of hidden tests of a problem (``data.code_task.tests_per_prompt``): the edge classes of every
family (at most 12) first, then random inputs. Chosen by the mutant measurement of ``results/code/kill_rates.md``:
12 is the fewest that reject every program of the suite on every row (at 10, 0.19 % of (program, row) pairs pass,
three quarters of the rows for one of them)."""
FRESH_TESTS = 6
"""The default number of held-out tests on fresh inputs (``data.code_task.fresh_tests``)."""

_MAX_TRIES = 2_000
_STREAMS = 1_000_003
"""Prompt i's tests come from ``random.Random((seed * _STREAMS + i) * 2)`` and its fresh tests from ``... * 2 + 1``:
streams of their own, so the problems do not depend on how many tests each has, nor the tests on the fresh tests."""


def _example_text(spec: CodeSpec, args: tuple) -> str:
    call = f"{spec.name}({', '.join(map(repr, args))})"
    return (
        f"Write a Python function `{spec.name}({spec.params})` that returns {spec.returns}. "
        f"For example, {call} returns {spec.ref(*args)!r}."
    )


def _assert(spec: CodeSpec, args: tuple) -> str:
    return f"assert {spec.name}({', '.join(map(repr, args))}) == {spec.ref(*args)!r}"


def _pick(spec: CodeSpec, rng: random.Random, first: list[Args], n: int, seen: set[str], family: str) -> list[str]:
    """``n`` tests on distinct inputs not in ``seen`` (which grows): ``first`` in order, then ``spec.draw``."""
    tests: list[str] = []
    queue = list(first)
    for _ in range(_MAX_TRIES + len(queue)):
        if len(tests) >= n:
            return tests
        args = queue.pop(0) if queue else spec.draw(rng)
        if repr(args) not in seen:
            seen.add(repr(args))
            tests.append(_assert(spec, args))
    raise ValueError(f"code family {family!r} ({spec.name}) has too few distinct inputs for {n} tests")


def _row(fam: str, i: int, width: int, spec: CodeSpec, example: Args, n_tests: int, n_fresh: int, seed: int) -> dict:
    seen = {repr(example)}
    rng = random.Random((seed * _STREAMS + i) * 2)
    tests = _pick(spec, rng, spec.edges(rng), n_tests, seen, fam)
    fresh: list[str] = []
    if n_fresh:
        rng = random.Random((seed * _STREAMS + i) * 2 + 1)
        first = spec.edges(rng)  # the edge classes again, with values drawn afresh, then random inputs
        rng.shuffle(first)
        fresh = _pick(spec, rng, first[: n_fresh // 2], n_fresh, seen, fam)
    row = {"id": f"{fam}-{i:0{width}d}", "problem": _example_text(spec, example), "tests": tests, "entry_point": spec.name}
    return row | ({"fresh_tests": fresh} if fresh else {})


def make_code_task(
    num_prompts: int,
    seed: int,
    families: list[str] | tuple[str, ...] | None = None,
    tests_per_prompt: int = TESTS_PER_PROMPT,
    fresh_tests: int = FRESH_TESTS,
) -> list[dict]:
    """``num_prompts`` distinct problems, prompt i from ``families[i % len(families)]`` (a family named twice gets
    twice the share; ``None``: :data:`DEFAULT_FAMILIES`), each with ``tests_per_prompt`` hidden tests (its edge
    classes first) and ``fresh_tests`` held-out tests on fresh inputs (row key ``fresh_tests``; absent when 0).

    Rows ``{"id": "FAMILY-00017", "problem", "tests", "entry_point"[, "fresh_tests"]}``; the id's number is the index
    over the whole list, so ids are unique and every result can be broken down by family (:func:`family_of`).
    Problems are distinct as texts (two rows may ask for the same function with different examples and tests).
    Raises ``ValueError`` on an unknown family, ``num_prompts <= 0``, ``tests_per_prompt <= 0``, ``fresh_tests < 0``,
    or a family with too few distinct problems or inputs. Deterministic in the arguments.
    """
    families = list(DEFAULT_FAMILIES if families is None else families)
    unknown = [f for f in families if f not in CODE_FAMILIES]
    if unknown or not families:
        raise ValueError(f"unknown code families {unknown or families}; valid: {', '.join(CODE_FAMILIES)}")
    if num_prompts <= 0:
        raise ValueError(f"num_prompts must be positive, got {num_prompts}")
    if tests_per_prompt <= 0:
        raise ValueError(f"tests_per_prompt must be positive, got {tests_per_prompt}")
    if fresh_tests < 0:
        raise ValueError(f"fresh_tests must be >= 0, got {fresh_tests}")
    rng = random.Random(seed)
    seen: set[str] = set()
    rows = []
    width = max(5, len(str(num_prompts - 1)))
    for i in range(num_prompts):
        fam = families[i % len(families)]
        for _ in range(_MAX_TRIES):
            spec = CODE_FAMILIES[fam](rng)
            example = spec.example(rng)
            problem = _example_text(spec, example)
            if problem not in seen:
                break
        else:
            raise ValueError(f"code family {fam!r} has too few distinct problems for {num_prompts} prompts")
        seen.add(problem)
        rows.append(_row(fam, i, width, spec, example, tests_per_prompt, fresh_tests, seed))
    return rows


@lru_cache(maxsize=None)
def _specs_by_name(family: str) -> dict[str, CodeSpec]:
    fam = CODE_FAMILIES[family]
    return {spec.name: spec for spec in (fam.build(*c) for c in fam.space)}


def spec_of(row: dict) -> CodeSpec:
    """The :class:`CodeSpec` of a :func:`make_code_task` row (from its id's family and its entry point)."""
    family = family_of(row["id"])
    if family not in CODE_FAMILIES or row["entry_point"] not in _specs_by_name(family):
        raise ValueError(f"{row['id']!r} / {row['entry_point']!r} is not a row of the procedural code task")
    return _specs_by_name(family)[row["entry_point"]]


def solution(row: dict) -> str:
    """A correct response to ``row``: its reference solution as a fenced python block (``add_7`` ->
    ``"```python\\ndef add_7(x):\\n    return x + 7\\n```"``)."""
    return f"```python\n{spec_of(row).source}```"


@dataclass
class CodeTaskConfig:
    """Settings of the procedural code task (``train: code_task``, with ``reward.domain: code``)."""

    num_prompts: int = 512
    """How many distinct function-writing problems the procedural code task generates."""
    seed: int = 1234
    """Seed of the generator; the same seed gives the same problems, tests and ids."""
    families: list[str] | None = None
    """Problem families (``graft.registry.CODE_FAMILIES``: add, transform, list_stat, ...): prompt i comes
    from ``families[i % len(families)]``; ``None``: every family but ``factorial``."""
    tests_per_prompt: int = TESTS_PER_PROMPT
    """Hidden ``assert f(x) == y`` tests per problem (never the example the problem text shows): each family's edge
    classes first, then random inputs. 12 is the fewest that reject every wrong program of the mutant suite on every
    row (``results/code/kill_rates.md``)."""
    fresh_tests: int = FRESH_TESTS
    """Held-out tests per problem on inputs drawn afresh from its family: never in the reward, run on rewarded
    programs only (status and monitor flag ``holdout_fail``: a program that fits the tests without solving the
    problem). 0: none."""

    def __post_init__(self) -> None:
        check(self.num_prompts > 0, "num_prompts", f"must be positive, got {self.num_prompts}")
        check(
            self.families is None or (len(self.families) > 0 and set(self.families) <= set(CODE_FAMILIES)),
            "families",
            f"must be a non-empty list of {CODE_FAMILIES.choices()} (or null); got {self.families}",
        )
        check(self.tests_per_prompt >= 1, "tests_per_prompt", f"must be >= 1, got {self.tests_per_prompt}")
        check(self.fresh_tests >= 0, "fresh_tests", f"must be >= 0, got {self.fresh_tests}")


class CodeTask(Task):
    """``data.train: code_task``: write one small Python function, graded by hidden tests (``reward.domain: code``)."""

    settings = CodeTaskConfig

    def rows(self, settings: CodeTaskConfig) -> list[dict]:
        return make_code_task(
            settings.num_prompts, settings.seed, settings.families, settings.tests_per_prompt, settings.fresh_tests
        )

    def families(self, settings: CodeTaskConfig) -> list[str]:
        return list(dict.fromkeys(settings.families or DEFAULT_FAMILIES))

    def check(self, cfg: Any) -> None:
        check(
            cfg.reward.domain == "code" or bool(cfg.reward.function),
            "reward.domain",
            f"is {cfg.reward.domain!r} but data.train=code_task has tests, not answers: set reward.domain=code",
        )


TASKS.register("code_task", CodeTask())
