"""The embedded default task: seeded procedural arithmetic problems.

``make_arithmetic(512, 30, ["+", "-", "*"], 1234)`` gives 512 distinct problems such as
``Prompt("arith-00017", "What is 17 + 25?", "42")``. The same arguments give the same
problems, ids and order on every run and platform (``random.Random(seed)`` with integer
draws only). Subtraction puts the larger operand first, so answers are never negative.

The wording of a problem is :func:`format_problem`'s ``style``; the default pair of
models should solve roughly 5-90% of a batch for GRPO groups to carry signal, so the
phrasing is a tuning knob. The ``\\boxed{}`` instruction is added by the prompt template,
not here.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from graft.config.checks import check
from graft.data.tasks import Task
from graft.registry import FAMILIES, STYLES, TASKS
from graft.types import Prompt

OPS = ("+", "-", "*")
_WORDS = {"+": "plus", "-": "minus", "*": "times"}
_LATEX = {"+": "+", "-": "-", "*": r"\times"}
_UNICODE = {"+": "+", "-": "-", "*": "×"}

STYLES.register("question", "What is {a} {op} {b}?")
STYLES.register("times", "What is {a} {op_unicode} {b}?")
STYLES.register("words", "What is {a} {op_word} {b}?")
STYLES.register("compute", "Compute ${a} {op_latex} {b}$.")
STYLES.register("calculate", "Calculate {a} {op} {b}.")

DEFAULT_STYLE = "question"


def format_problem(a: int, op: str, b: int, style: str = DEFAULT_STYLE) -> str:
    """The problem text of ``a op b`` in ``style``: a name from ``graft.registry.STYLES`` or a format
    string using the same fields (e.g. ``"Add {a} and {b}."``)."""
    template = STYLES.get(style, style)
    try:
        if "{a}" not in template or "{b}" not in template:
            raise ValueError
        return template.format(a=a, b=b, op=op, op_word=_WORDS[op], op_latex=_LATEX[op], op_unicode=_UNICODE[op])
    except (KeyError, IndexError, ValueError):
        raise ValueError(
            f"unknown arithmetic style {style!r}: use one of {', '.join(STYLES)} or a format string "
            "with {a} and {b} (and optionally {op}, {op_word}, {op_latex}, {op_unicode})"
        ) from None


def _value(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def make_arithmetic(
    num_prompts: int, max_operand: int, ops: list[str] | tuple[str, ...], seed: int, style: str = DEFAULT_STYLE
) -> list[Prompt]:
    """``num_prompts`` distinct problems ``a op b`` with operands in [0, max_operand].

    Ids are ``arith-00000``, ``arith-00001``, ... in generation order. Raises ``ValueError``
    when fewer than ``num_prompts`` distinct problems exist for these operands and operators.
    """
    ops = list(ops)
    if num_prompts <= 0:
        raise ValueError(f"num_prompts must be positive, got {num_prompts}")
    if max_operand < 0:
        raise ValueError(f"max_operand must be >= 0, got {max_operand}")
    if not ops or any(op not in OPS for op in ops):
        raise ValueError(f"ops must be a non-empty list drawn from {OPS}, got {ops}")
    ops = sorted(set(ops), key=OPS.index)  # order-insensitive: ["*", "+"] == ["+", "*"]
    n = max_operand + 1
    per_op = {"+": n * n, "*": n * n, "-": n * (n + 1) // 2}  # "-" is ordered: a >= b
    available = sum(per_op[op] for op in ops)
    if num_prompts > available:
        raise ValueError(
            f"only {available} distinct problems exist with max_operand={max_operand} and ops={ops}; asked for {num_prompts}"
        )
    rng = random.Random(seed)
    if 2 * num_prompts > available:  # dense: sample from the full list instead of rejecting
        everything = [(a, op, b) for op in ops for a in range(n) for b in range(n) if op != "-" or a >= b]
        triples = rng.sample(everything, num_prompts)
    else:
        seen: set[tuple[int, str, int]] = set()
        triples = []
        while len(triples) < num_prompts:
            op = ops[rng.randrange(len(ops))]
            a, b = rng.randrange(n), rng.randrange(n)
            if op == "-" and a < b:
                a, b = b, a
            if (a, op, b) not in seen:
                seen.add((a, op, b))
                triples.append((a, op, b))
    width = max(5, len(str(num_prompts - 1)))
    return [
        Prompt(id=f"arith-{i:0{width}d}", problem=format_problem(a, op, b, style), answer=str(_value(a, op, b)))
        for i, (a, op, b) in enumerate(triples)
    ]


# ----------------------------------------------------------------------------- problem families

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen"
).split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_words(n: int) -> str:
    """English words of 0 <= n <= 999 (``47`` -> ``forty-seven``, ``305`` -> ``three hundred five``)."""
    if not 0 <= n <= 999:
        raise ValueError(f"number_words covers 0..999, got {n}")
    if n >= 100:
        rest = n % 100
        return f"{_ONES[n // 100]} hundred" + (f" {number_words(rest)}" if rest else "")
    if n < 20:
        return _ONES[n]
    return _TENS[n // 10 - 2] + (f"-{_ONES[n % 10]}" if n % 10 else "")


def _pair(rng: random.Random, lo: int, hi: int) -> tuple[int, int]:
    return rng.randint(lo, hi), rng.randint(lo, hi)


def _ordered(rng: random.Random, lo: int, hi: int) -> tuple[int, int]:
    a, b = _pair(rng, lo, hi)
    return (a, b) if a >= b else (b, a)


@FAMILIES.register("add")
def _fam_add(rng, m):
    a, b = _pair(rng, 0, m)
    return f"What is {a} + {b}?", a + b


@FAMILIES.register("sub")
def _fam_sub(rng, m):
    a, b = _ordered(rng, 0, m)
    return f"What is {a} - {b}?", a - b


@FAMILIES.register("mul")
def _fam_mul(rng, m):
    a, b = _pair(rng, 0, m)
    return f"What is {a} * {b}?", a * b


@FAMILIES.register("words")
def _fam_words(rng, m):
    a, b = _pair(rng, 0, m)
    op = rng.choice(("plus", "times"))
    return f"What is {a} {op} {b}?", a + b if op == "plus" else a * b


@FAMILIES.register("latex")
def _fam_latex(rng, m):
    a, b = _pair(rng, 0, m)
    op = rng.choice(("+", "\\times"))
    return f"Compute ${a} {op} {b}$.", a + b if op == "+" else a * b


@FAMILIES.register("chain")
def _fam_chain(rng, m):
    a, b, c = rng.randint(0, m), rng.randint(0, m), rng.randint(0, m)
    return f"What is {a} + {b} - {c}?", a + b - c


@FAMILIES.register("story_add")
def _fam_story_add(rng, m):
    a, b = _pair(rng, 1, m)
    return f"Sam has {a} marbles and finds {b} more. How many marbles does Sam have now?", a + b


@FAMILIES.register("story_sub")
def _fam_story_sub(rng, m):
    a, b = _ordered(rng, 1, m)
    return f"A shelf holds {a} books. {b} of them are taken away. How many books are left on the shelf?", a - b


@FAMILIES.register("story_mul")
def _fam_story_mul(rng, m):
    a, b = _pair(rng, 2, max(2, m // 2))
    return f"There are {a} bags with {b} apples in each bag. How many apples are there in total?", a * b


@FAMILIES.register("spelled")
def _fam_spelled(rng, m):
    a, b = _pair(rng, 0, min(m, 99))
    return f"What is {number_words(a)} plus {number_words(b)}?", a + b


@FAMILIES.register("big_add")
def _fam_big_add(rng, m):
    a, b = _pair(rng, 100, 999)
    return f"What is {a} + {b}?", a + b


@FAMILIES.register("div")
def _fam_div(rng, m):
    b, q = rng.randint(2, 12), rng.randint(2, max(2, m))
    return f"What is {b * q} divided by {b}?", q


@FAMILIES.register("mod")
def _fam_mod(rng, m):
    a, b = rng.randint(10, max(10, 3 * m)), rng.randint(2, 9)
    return f"What is the remainder when {a} is divided by {b}?", a % b


@FAMILIES.register("square")
def _fam_square(rng, m):
    a = rng.randint(0, 2 * m)
    return f"What is {a} squared?", a * a


@FAMILIES.register("next")
def _fam_next(rng, m):
    a = rng.randint(10, 999)
    return f"What number comes right after {a}?", a + 1


@FAMILIES.register("double")
def _fam_double(rng, m):
    a = rng.randint(0, 5 * m)
    return f"What is twice {a}?", 2 * a


@FAMILIES.register("max")
def _fam_max(rng, m):
    a, b = rng.sample(range(0, 10 * m + 1), 2)
    return f"Which number is larger: {a} or {b}?", max(a, b)


_NUMBER_WORD = {number_words(n): n for n in range(1000)}
_NUMBER_WORDS = re.compile(r"\b(" + "|".join(sorted(map(re.escape, _NUMBER_WORD), key=len, reverse=True)) + r")\b")
_IMPLIED_OPERAND = (
    ("squared", lambda ints: ints + ints),
    ("twice", lambda ints: [*ints, 2]),
    ("right after", lambda ints: [*ints, 1]),
)
"""Wordings whose computation has an operand the text does not write: ``a squared`` is a × a, ``twice a`` is
2 × a, ``the number right after a`` is a + 1."""


def problem_key(problem: str, answer: object) -> tuple:
    """What makes two problems the same computation, whatever their wording: the operands, in any order, and the
    answer. Numbers written as words count (``"What is nine plus zero?"`` is ``"What is 0 + 9?"``), and so does an
    operand the wording implies (:data:`_IMPLIED_OPERAND`: ``"What is 17 squared?"`` is ``"Compute $17 \\times
    17$."``). ``"What is 13 * 14?"``, ``"Compute $14 \\times 13$."`` and ``"There are 13 bags with 14 apples in each
    bag. ..."`` -> ``((13, 14), "182")``. Two computations with the same operands and answer but different operations
    (``2 + 2``, ``2 * 2``) share a key: splits kept apart by it lose a few candidates, never keep a repeat. A problem
    with no number is its lower-cased, whitespace-collapsed text. Held-out splits are kept apart from training and
    from each other by this key."""
    text = " ".join(problem.lower().split())
    ints = [int(x) for x in re.findall(r"\d+", _NUMBER_WORDS.sub(lambda m: str(_NUMBER_WORD[m.group(1)]), text))]
    if not ints:
        return (text,)
    for phrase, complete in _IMPLIED_OPERAND:
        if phrase in text:
            ints = complete(ints)
    return (tuple(sorted(ints)), str(answer))


def make_families(
    num_prompts: int,
    families: list[str] | tuple[str, ...],
    max_operand: int,
    seed: int,
    exclude: set | frozenset = frozenset(),
    key: Callable[[str, object], Hashable] | None = None,
) -> list[Prompt]:
    """``num_prompts`` distinct problems, prompt i from ``families[i % len(families)]`` (a family named
    twice gets twice the share). Ids are ``FAMILY-00017`` (the index over the whole list), so every
    result can be broken down by family. ``exclude``: keys that must not appear (e.g. the training prompts',
    when generating a test split with another seed); ``key(problem, answer)``: what counts as the same problem
    (default: its text; :func:`problem_key` for held-out splits). Deterministic in the arguments.
    """
    key = key or (lambda problem, answer: problem)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        raise ValueError(f"unknown arithmetic families {unknown or families}; valid: {', '.join(FAMILIES)}")
    if num_prompts <= 0:
        raise ValueError(f"num_prompts must be positive, got {num_prompts}")
    rng = random.Random(seed)
    seen, out = set(exclude), []
    width = max(5, len(str(num_prompts - 1)))
    for i in range(num_prompts):
        fam = families[i % len(families)]
        for _ in range(10_000):
            problem, answer = FAMILIES[fam](rng, max_operand)
            if key(problem, answer) not in seen:
                break
        else:
            raise ValueError(
                f"family {fam!r} with max_operand={max_operand} has too few distinct problems for {num_prompts} prompts"
            )
        seen.add(key(problem, answer))
        out.append(Prompt(id=f"{fam}-{i:0{width}d}", problem=problem, answer=str(answer)))
    return out


@dataclass
class ArithmeticConfig:
    """Settings of the procedural arithmetic task."""

    num_prompts: int = 512
    """How many distinct problems the procedural task generates."""
    max_operand: int = 30
    """Operands are drawn from [0, max_operand]."""
    ops: list[str] = field(default_factory=lambda: ["+", "-", "*"])
    """Operators to draw from."""
    seed: int = 1234
    """Seed of the generator; the same seed gives the same problems and ids."""
    style: str = "question"
    """Problem phrasing: a name from ``graft.registry.STYLES`` or a format string with ``{a}`` and ``{b}``."""
    families: list[str] | None = None
    """A mixture of problem families (``graft.registry.FAMILIES``: add, story_mul, spelled, ...):
    prompt i comes from ``families[i % len(families)]`` (name a family twice for twice the share), with
    ids ``FAMILY-00017``. ``None``: single-step ``a op b`` problems from ``ops`` and ``style``."""

    def __post_init__(self) -> None:
        check(self.num_prompts > 0, "num_prompts", f"must be positive, got {self.num_prompts}")
        check(
            self.families is None or (len(self.families) > 0 and set(self.families) <= set(FAMILIES)),
            "families",
            f"must be a non-empty list of {', '.join(FAMILIES)}; got {self.families}",
        )
        check(self.max_operand >= 0, "max_operand", f"must be >= 0, got {self.max_operand}")
        check(
            set(self.ops) <= {"+", "-", "*"} and len(self.ops) > 0, "ops", f"must be a non-empty subset of + - *, got {self.ops}"
        )
        template = STYLES.get(self.style, self.style)
        try:
            fits = (
                "{a}" in template
                and "{b}" in template
                and bool(template.format(a=1, b=2, op="+", op_word="plus", op_latex="+", op_unicode="+"))
            )
        except (KeyError, IndexError, ValueError):
            fits = False
        check(
            fits,
            "style",
            f"unknown arithmetic style {self.style!r}: use one of {', '.join(STYLES)} or a format "
            "string with {a} and {b} (and optionally {op}, {op_word}, {op_latex}, {op_unicode})",
        )


class ArithmeticTask(Task):
    """``data.train: arithmetic``: single-step ``a op b`` problems in a style, or a mixture of problem families."""

    settings = ArithmeticConfig

    def rows(self, settings: ArithmeticConfig) -> list[dict]:
        if settings.families:
            prompts = make_families(settings.num_prompts, settings.families, settings.max_operand, settings.seed)
        else:
            prompts = make_arithmetic(settings.num_prompts, settings.max_operand, settings.ops, settings.seed, settings.style)
        return [vars(p) for p in prompts]

    def families(self, settings: ArithmeticConfig) -> list[str]:
        return list(dict.fromkeys(settings.families or []))

    def draw(self, settings: ArithmeticConfig, family: str, rng: random.Random) -> tuple[str, str]:
        problem, answer = FAMILIES[family](rng, settings.max_operand)
        return problem, str(answer)

    def key(self, problem: str, answer: str) -> Hashable:
        return problem_key(problem, answer)

    def held_out(self, settings: ArithmeticConfig, count: int, scale: int, seed: int, taken: set) -> list[Prompt]:
        return make_families(count, settings.families or [], settings.max_operand * scale, seed, exclude=taken, key=problem_key)

    def check(self, cfg: Any) -> None:
        n = cfg.data.tasks[self.name].num_prompts
        check(
            cfg.batch_prompts <= n,
            "batch_prompts",
            f"{cfg.batch_prompts} exceeds the {n} prompts of the arithmetic task (data.arithmetic.num_prompts): "
            "a batch would repeat prompts",
        )


TASKS.register("arithmetic", ArithmeticTask())
