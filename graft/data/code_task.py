"""The ``code`` domain's embedded task: seeded procedural problems asking for one small Python function.

``make_code_task(3, 0, ["add", "transform", "palindrome"])`` gives rows such as::

    {"id": "add-00000",
     "problem": "Write a Python function `add_50(x)` that returns x plus 50. For example, add_50(97) returns 147.",
     "tests": ["assert add_50(53) == 103", "assert add_50(5) == 55", "assert add_50(33) == 83",
               "assert add_50(65) == 115"],
     "entry_point": "add_50"}

(hand-checked: 97 + 50 = 147 in the text; 53 + 50 = 103 in the first test). A row asks for ONE function, states
precisely what it returns and shows ONE example call with its result. Its ``tests`` are hidden unit tests of
exactly the form ``assert NAME(ARGS) == LITERAL`` (literal arguments, literal expected value: a grader can split
each into call and expected value, and the expected values never need to enter the sandbox), on inputs that
differ from the example's and from each other. Expected values come from the reference implementation of each
family (:attr:`CodeSpec.ref`, plain Python); :func:`solution` gives the separately written reference *source*
(a correct response), and the tests check that the two agree.

Families (:data:`CODE_FAMILIES`, name -> generator, easiest first within each group) draw their constants,
so a family has many distinct functions: ``add_7`` and ``add_12`` are two problems of ``add``. The function name
carries the constants (``clamp_3_20``, ``count_e``), so one name always means one specification, in every
draw. Families whose function is fixed (``transform``'s ``reverse_string``, ``palindrome``, ...) vary by the
example and the tests only. Boolean and piecewise families draw their test inputs from alternating strata
(divisible / not, palindrome / not, below / inside / above the range), so a constant answer cannot pass
all the tests. The first four tests also hold inputs on which each family's plausible near misses go wrong
(``multiple``: n = 0; ``count_above``: k itself; ``max_of_list``: an all-negative list; ``palindrome``: a near
palindrome; see each draw's comment), made by reshaping drawn values, without further draws;
tests/data/test_code_task.py lists the shortcuts and near misses that must fail (with fewer tests some pass).

Like :mod:`graft.data.arithmetic`: ``random.Random(seed)`` with integer draws only (``randint``,
``randrange``, ``choice``), so the same arguments give the same rows, ids and order on every run and
platform. The instruction to answer in a fenced ```python block belongs to the prompt template, not here.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from graft.config.checks import check
from graft.data.tasks import Task, family_of
from graft.registry import TASKS


@dataclass(frozen=True)
class CodeSpec:
    """One function to write: ``name(params)`` returns ``returns`` (the problem's wording)."""

    name: str
    """The entry point, carrying the family's constants (``add_7``)."""
    params: str
    """The parameter list as written in the problem (``x``, ``nums``)."""
    returns: str
    """What the function returns, the text after "that returns" (``x plus 7``)."""
    ref: Callable[..., Any]
    """The reference implementation: computes every expected value."""
    draw: Callable[[random.Random, int], tuple]
    """The arguments of call ``j`` (``j = 0``: the example; ``1, 2, ...``: the tests), drawn from ``rng``."""
    source: str
    """The reference solution's code (what :func:`solution` returns), written apart from ``ref``."""


@dataclass(frozen=True)
class CodeFamily:
    """A family: ``build(*constants)`` over the constants ``space``; calling it with an rng draws one spec."""

    build: Callable[..., CodeSpec]
    space: tuple[tuple, ...]

    def __call__(self, rng: random.Random) -> CodeSpec:
        return self.build(*self.space[rng.randrange(len(self.space))])

    @property
    def doc(self) -> str:
        """The family's one-line description (its builder's docstring)."""
        return (self.build.__doc__ or "").strip()


# ----------------------------------------------------------------------------- input draws

_WORDS = tuple(
    """apple banana cherry grape lemon mango melon peach pear plum berry olive onion pepper carrot
tomato potato garden river forest desert island ocean planet rocket window mirror pencil paper letter button
bottle basket candle castle dragon tiger zebra monkey rabbit turtle parrot eagle falcon spider kitten puppy
silver golden purple orange yellow green black white happy quick quiet sunny windy rainy cloudy stone
bridge tunnel market school doctor farmer singer writer painter sailor summer winter spring autumn
morning evening coffee butter cookie pizza pasta salad honey sugar water music guitar piano violin
drum python code data table chair sofa lamp clock phone camera""".split()
)

_VOWELS = "aeiou"


def _letters(rng: random.Random, lo: int, hi: int) -> str:
    """``lo..hi`` random lowercase letters."""
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(lo, hi)))


def _text(rng: random.Random) -> str:
    """A lowercase word: from :data:`_WORDS` or random letters (3..8), even odds."""
    return rng.choice(_WORDS) if rng.randrange(2) else _letters(rng, 3, 8)


def _ints(rng: random.Random, lo: int, hi: int, min_len: int, max_len: int) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(min_len, max_len))]


def _with_letter(rng: random.Random, c: str) -> str:
    """A word holding the letter ``c`` one to three more times, at random places."""
    s = _text(rng)
    for _ in range(rng.randint(1, 3)):
        i = rng.randint(0, len(s))
        s = s[:i] + c + s[i:]
    return s


def _palindrome(rng: random.Random) -> str:
    half = _letters(rng, 1, 4)
    return half + (rng.choice(string.ascii_lowercase) if rng.randrange(2) else "") + half[::-1]


def _not_palindrome(rng: random.Random) -> str:
    s = _text(rng)
    if s == s[::-1]:  # first and last letters differ afterwards
        s = chr((ord(s[-1]) - ord("a") + 1) % 26 + ord("a")) + s[1:]
    return s


def _mixed_case(rng: random.Random) -> str:
    """A word with random letters in upper case, at least one."""
    s = "".join(c.upper() if rng.randrange(2) else c for c in _text(rng))
    return s if s != s.lower() else s[0].upper() + s[1:]


# ----------------------------------------------------------------------------- number families


def _add(k: int) -> CodeSpec:
    """add_k(x) returns x + k, for k in 1..99."""
    return CodeSpec(
        f"add_{k}",
        "x",
        f"x plus {k}",
        lambda x: x + k,
        lambda rng, j: (rng.randint(0, 99),),
        f"def add_{k}(x):\n    return x + {k}\n",
    )


def _mul(k: int) -> CodeSpec:
    """times_k(x) returns x * k, for k in 2..12."""
    return CodeSpec(
        f"times_{k}",
        "x",
        f"x times {k}",
        lambda x: x * k,
        lambda rng, j: (rng.randint(0, 60),),
        f"def times_{k}(x):\n    return x * {k}\n",
    )


def _multiple(k: int) -> CodeSpec:
    """is_multiple_of_k(n) returns whether k divides n (k in 2..12; k = 2 is "is even"); tests alternate True/False."""

    # j = 0: the example, j >= 1: the tests. The first test is a positive n below k, so `n % k == 0 or n // k == 0`
    # (rewarded in a run when no test tried such an n: results/code/README.md) fails. The second is n = 0 (divisible
    # by every k), so `n % k == 0 and n > 0` fails; no other draw is 0 (m = 0 reads as 61 in the other multiples).
    # A wrong divisor fails too: for composite k the False tests are k // q and k * m + k // p (p, q the smallest
    # and largest prime factors of k), so every proper divisor of k divides one of them (12: 4 and 12m + 6), and
    # the fourth test is k * m with m divisible by neither k - 1 nor k + 1.
    p = next(d for d in range(2, k + 1) if k % d == 0)
    q = next(d for d in range(k, 1, -1) if k % d == 0 and all(d % e for e in range(2, d)))

    def draw(rng, j):
        m, r = rng.randint(0, 60), 0 if j % 2 == 0 else rng.randint(1, k - 1)
        if j == 1:
            return (k // q if q < k else r,)
        if j == 2:
            return (0,)
        if j == 3:
            return (k * m + (k // p if p < k else r),)
        if j == 4:
            m = next(x for x in range(m or 1, m + 5) if x % (k + 1) and (k < 3 or x % (k - 1)))
        return (k * (m or 61) + r,)

    return CodeSpec(
        f"is_multiple_of_{k}",
        "n",
        f"True if the integer n is divisible by {k}, and False otherwise",
        lambda n: n % k == 0,
        draw,
        f"def is_multiple_of_{k}(n):\n    return n % {k} == 0\n",
    )


def _distance(k: int) -> CodeSpec:
    """distance_from_k(x) returns abs(x - k), for k in 1..60; inputs alternate below and above k."""

    def draw(rng, j):
        return (rng.randint(k - 30, k - 1) if j % 2 == 0 else rng.randint(k + 1, k + 30),)

    return CodeSpec(
        f"distance_from_{k}",
        "x",
        f"the absolute difference between the integer x and {k}",
        lambda x: abs(x - k),
        draw,
        f"def distance_from_{k}(x):\n    return abs(x - {k})\n",
    )


def _clamp(lo: int, hi: int) -> CodeSpec:
    """clamp_lo_hi(x) returns x limited to [lo, hi] (0 <= lo <= 20, hi - lo in 5..40); inputs inside, below, above."""

    def draw(rng, j):
        return ((rng.randint(lo + 1, hi - 1), rng.randint(lo - 20, lo - 1), rng.randint(hi + 1, hi + 20))[j % 3],)

    return CodeSpec(
        f"clamp_{lo}_{hi}",
        "x",
        f"the integer x limited to the range {lo} to {hi}: {lo} when x is less "
        f"than {lo}, {hi} when x is greater than {hi}, and x itself otherwise",
        lambda x: min(max(x, lo), hi),
        draw,
        f"def clamp_{lo}_{hi}(x):\n    if x < {lo}:\n        return {lo}\n    if x > {hi}:\n        return {hi}\n    return x\n",
    )


def _digit_sum() -> CodeSpec:
    """sum_of_digits(n) returns the sum of the decimal digits of n >= 0 (one function; n has 1 to 6 digits)."""

    # The first test is n * 1000 + 789 (digit sum >= 24): `n % 9`, the digital root, `n % 10 + n // 10` and
    # returning n itself all fail there, while a test of 1 or 2 digits cannot tell them from the digit sum.
    def draw(rng, j):
        n = rng.randint(0, 10 ** rng.randint(1, 6) - 1)
        return (n * 1000 + 789 if j == 1 else n,)

    return CodeSpec(
        "sum_of_digits",
        "n",
        "the sum of the decimal digits of the non-negative integer n",
        lambda n: sum(int(d) for d in str(n)),
        draw,
        "def sum_of_digits(n):\n    total = 0\n    while n > 0:\n        total += n % 10\n        n //= 10\n    return total\n",
    )


def _factorial() -> CodeSpec:
    """factorial(n) returns n! for n in 0..10 (one function, 11 inputs: 11 problems, not in the default mix)."""

    def ref(n):
        out = 1
        for i in range(2, n + 1):
            out *= i
        return out

    # The first test is n = 0 (unless the example, drawn just before, is 0: then n = 1), so a recursion whose only
    # base case is n == 1 (RecursionError at 0) fails. The example's n is kept to tell the two apart.
    shown: list[int] = []

    def draw(rng, j):
        n = rng.randint(0, 10)
        if j == 0:
            shown[:] = [n]
        return (1 if shown == [0] else 0,) if j == 1 else (n,)

    return CodeSpec(
        "factorial",
        "n",
        "the factorial of the integer n >= 0, that is 1 * 2 * ... * n (and 1 when n is 0)",
        ref,
        draw,
        "def factorial(n):\n    result = 1\n    for i in range(1, n + 1):\n        result *= i\n    return result\n",
    )


# ----------------------------------------------------------------------------- string families


def _capital_first(rng: random.Random, j: int) -> str:
    """to_upper's inputs: the first test starts with a capital ('Clock'): on lowercase words only, `s.swapcase()` and
    `chr(ord(c) - 32)` for every c agree with `s.upper()`."""
    s = _text(rng)
    return s[0].upper() + s[1:] if j == 1 else s


_TRANSFORMS: dict[str, tuple[str, Callable[[str], str], str, Callable[[random.Random, int], str]]] = {
    "reverse_string": ("the string s reversed", lambda s: s[::-1], "s[::-1]", lambda rng, j: _text(rng)),
    "to_upper": ("the string s with every letter in upper case", str.upper, "s.upper()", _capital_first),
    "to_lower": ("the string s with every letter in lower case", str.lower, "s.lower()", lambda rng, j: _mixed_case(rng)),
}
"""Per function: what it returns, the reference, the reference solution's expression, and the input of call j."""


def _transform(name: str) -> CodeSpec:
    """reverse_string(s), to_upper(s) or to_lower(s): one of three fixed string functions."""
    returns, ref, expr, text = _TRANSFORMS[name]
    return CodeSpec(name, "s", returns, ref, lambda rng, j: (text(rng, j),), f"def {name}(s):\n    return {expr}\n")


def _count_char(c: str) -> CodeSpec:
    """count_c(s) returns how many times the letter c appears in s (26 letters), or count_vowels(s) (c = "vowels")."""
    if c == "vowels":
        # The first test ends in "uyu": counting y, distinct vowels only, or missing u all fail there.
        return CodeSpec(
            "count_vowels",
            "s",
            "the number of vowels (a, e, i, o, u) in the lowercase string s",
            lambda s: sum(ch in _VOWELS for ch in s),
            lambda rng, j: (_text(rng) + ("uyu" if j == 1 else ""),),
            "def count_vowels(s):\n    return sum(1 for ch in s if ch in 'aeiou')\n",
        )

    # The second test holds c at least twice, so `c in s` (True == 1, False == 0) cannot pass on counts of 0 and 1.
    def draw(rng, j):
        if j % 2:
            return (_text(rng),)
        s = _with_letter(rng, c)
        return (s if j != 2 or s.count(c) > 1 else s[: len(s) // 2] + c + s[len(s) // 2 :],)

    return CodeSpec(
        f"count_{c}",
        "s",
        f"the number of times the letter '{c}' appears in the string s",
        lambda s: s.count(c),
        draw,
        f"def count_{c}(s):\n    return s.count('{c}')\n",
    )


def _repeat(k: int) -> CodeSpec:
    """repeat_k(s) returns s written k times in a row, for k in 2..9."""
    return CodeSpec(
        f"repeat_{k}",
        "s",
        f"the string s repeated {k} times, joined into one string",
        lambda s: s * k,
        lambda rng, j: (_letters(rng, 1, 4),),
        f"def repeat_{k}(s):\n    return s * {k}\n",
    )


def _first_n(n: int) -> CodeSpec:
    """first_n(s) returns the first n characters of s, all of s if shorter (n in 1..9); inputs alternate longer/not."""

    def draw(rng, j):  # a longer test never ends as it starts (its last letter moves on), so s[-n:] fails there
        if j % 2:
            return (_letters(rng, 1, n),)
        s = _letters(rng, n + 1, n + 6)
        return (s[:-1] + chr((ord(s[-1]) - ord("a") + 1) % 26 + ord("a")) if j and s[-n:] == s[:n] else s,)

    returns = (
        "the first character of the non-empty string s"
        if n == 1
        else f"the first {n} characters of the string s (all of s when s is shorter than {n} characters)"
    )
    return CodeSpec(f"first_{n}", "s", returns, lambda s: s[:n], draw, f"def first_{n}(s):\n    return s[:{n}]\n")


def _palindrome_draw(rng: random.Random, j: int) -> tuple:
    """Test j: 1 any non-palindrome, 2 an even palindrome, 3 a near palindrome, 4 an odd palindrome, then again.

    The near palindrome is w + w[::-1] with its two middle letters made to differ ('nktug' -> 'nktughutkn'): every
    check of only the ends (s[0] == s[-1]), or of all pairs but the middle one, says True there. Even and odd
    palindromes both: comparing s[:len(s) // 2] with s[len(s) // 2:][::-1] fails on odd ones.
    """
    if j % 2:
        s = _not_palindrome(rng)
        return (s + chr((ord(s[-1]) - ord("a") + 1) % 26 + ord("a")) + s[-2::-1] if j % 4 == 3 else s,)
    s = _palindrome(rng)
    h = len(s) // 2
    if j and j % 4 == 2 and len(s) % 2:  # even: drop the middle letter
        s = s[:h] + s[h + 1 :]
    elif j and j % 4 == 0 and len(s) % 2 == 0:  # odd: double the middle letter
        s = s[:h] + s[h] + s[h:]
    if j and len(set(s)) == 1:  # two letters at least ('cc' -> 'dccd'): s == ''.join(sorted(s)) fails
        s = chr((ord(s[0]) - ord("a") + 1) % 26 + ord("a")).join(("", s, ""))
    return (s,)


def _palindrome_fn() -> CodeSpec:
    """is_palindrome(s) returns whether s reads the same backwards (one function); tests alternate True/False."""
    return CodeSpec(
        "is_palindrome",
        "s",
        "True if the lowercase string s reads the same forwards and backwards, and False otherwise",
        lambda s: s == s[::-1],
        _palindrome_draw,
        "def is_palindrome(s):\n    return s == s[::-1]\n",
    )


# ----------------------------------------------------------------------------- list families


def _sum_list_input(v: list[int], j: int) -> list[int]:
    """Test 1 is [] (`nums[0] + ...`, `reduce` fail), test 2 all negative (`abs`, positives only fail), no other call
    is empty ([] reads as [0])."""
    return [] if j == 1 else [x - 51 for x in v or [0]] if j == 2 else v or [0]


def _max_of_list_input(v: list[int], j: int) -> list[int]:
    """Test 1 all negative with its unique maximum last (`m = 0` as the start, `nums[0]`, `max(nums[:-1])` fail), test
    2 a unique maximum first (`nums[-1]`, `max(nums[1:])` fail)."""
    return [x - 52 for x in v] + [-1] if j == 1 else [max(v) + 1, *v] if j == 2 else v


def _list_length_input(v: list[int], j: int) -> list[int]:
    """Test 1 repeats an element (`len(set(items))` fails)."""
    return (v + v[:1] if v else [0, 0]) if j == 1 else v


def _last_element_input(v: list[int], j: int) -> list[int]:
    """Test 1 ends in a value that is neither its first, its largest nor its smallest ([a - 1, ..., a + 1, a])."""
    return [v[0] - 1, *v[1:], v[0] + 1, v[0]] if j == 1 else v


@dataclass(frozen=True)
class _Stat:
    """One fixed list function: its parameter, what it returns (the prompt's words), the reference, the shortest
    list it takes, the reference solution's expression, and ``test_input(v, j)``: the list of call ``j`` made from
    the drawn list ``v`` (no further draws: the same rng use for every function)."""

    param: str
    returns: str
    ref: Callable[..., Any]
    min_len: int
    expr: str
    test_input: Callable[[list[int], int], list[int]]


_STATS: dict[str, _Stat] = {
    "sum_list": _Stat(
        "nums", "the sum of the integers in the list nums (0 when nums is empty)", sum, 0, "sum(nums)", _sum_list_input
    ),
    "max_of_list": _Stat("nums", "the largest integer in the non-empty list nums", max, 1, "max(nums)", _max_of_list_input),
    "list_length": _Stat("items", "the number of elements in the list items", len, 0, "len(items)", _list_length_input),
    "last_element": _Stat(
        "items", "the last element of the non-empty list items", lambda v: v[-1], 1, "items[-1]", _last_element_input
    ),
}


def _list_stat(name: str) -> CodeSpec:
    """sum_list(nums), max_of_list(nums), list_length(items) or last_element(items): four fixed list functions."""
    st = _STATS[name]
    return CodeSpec(
        name,
        st.param,
        st.returns,
        st.ref,
        lambda rng, j: (st.test_input(_ints(rng, -9, 50, st.min_len, 6), j),),
        f"def {name}({st.param}):\n    return {st.expr}\n",
    )


def _count_above(k: int) -> CodeSpec:
    """count_greater_than_k(nums) returns how many integers of nums exceed k, for k in 0..20 (0: count positives)."""

    # The first test starts with k + 1 and ends with k: `v >= k`, `v > k - 1` and `v > k + 1` all miscount it. The
    # second has no integer above k (those above are mirrored to 2k - v): its answer 0 differs from the first's.
    def draw(rng, j):
        nums = _ints(rng, k - 10, k + 10, 2, 7)
        if j == 1:
            return ([k + 1, *nums[1:-1], k],)
        return ([min(v, 2 * k - v) for v in nums] if j == 2 else nums,)

    return CodeSpec(
        f"count_greater_than_{k}",
        "nums",
        f"how many integers in the list nums are greater than {k}",
        lambda nums: sum(v > k for v in nums),
        draw,
        f"def count_greater_than_{k}(nums):\n    count = 0\n    for v in nums:\n        if v > {k}:\n"
        "            count += 1\n    return count\n",
    )


def _scale(k: int) -> CodeSpec:
    """multiply_each_by_k(nums) returns [v * k for v in nums], for k in 2..10 (2: double each)."""

    # The first test starts with its unique largest value and ends with a negative one: a sorted result, or
    # abs(v) * k, fails there.
    def draw(rng, j):
        nums = _ints(rng, -5, 20, 1, 5)
        return ([max(nums) + 1, *nums, -abs(nums[0]) - 1] if j == 1 else nums,)

    return CodeSpec(
        f"multiply_each_by_{k}",
        "nums",
        f"a new list holding each integer of the list nums multiplied by {k}, in the same order",
        lambda nums: [v * k for v in nums],
        draw,
        f"def multiply_each_by_{k}(nums):\n    return [v * {k} for v in nums]\n",
    )


def _keep_multiples(k: int) -> CodeSpec:
    """keep_multiples_of_k(nums) returns the integers of nums divisible by k, in order (k in 2..9; 2: the evens)."""

    # The first test starts with a multiple m >= 2k and ends with m - k twice (kept in that order and with the repeat:
    # a sorted result, a set, or the list read backwards fails there); the third holds 0, divisible by every k
    # (`if v and v % k == 0` fails).
    def draw(rng, j):
        nums = _ints(rng, 0, 40, 2, 6)
        if j % 2 == 0:  # at least one multiple: a non-empty answer
            nums[rng.randrange(len(nums))] = k * rng.randint(1, 40 // k)
        elif j == 1:
            m = k * max(2, nums[0] // k)
            nums = [m, *nums[1:-1], m - k, m - k]
        elif j == 3:
            nums[len(nums) // 2] = 0
        return (nums,)

    return CodeSpec(
        f"keep_multiples_of_{k}",
        "nums",
        f"a list of the integers in the list nums that are divisible by {k}, in their original order",
        lambda nums: [v for v in nums if v % k == 0],
        draw,
        f"def keep_multiples_of_{k}(nums):\n    return [v for v in nums if v % {k} == 0]\n",
    )


CODE_FAMILIES: dict[str, CodeFamily] = {
    # numbers
    "add": CodeFamily(_add, tuple((k,) for k in range(1, 100))),
    "mul": CodeFamily(_mul, tuple((k,) for k in range(2, 13))),
    "multiple": CodeFamily(_multiple, tuple((k,) for k in range(2, 13))),
    "distance": CodeFamily(_distance, tuple((k,) for k in range(1, 61))),
    "clamp": CodeFamily(_clamp, tuple((lo, lo + w) for lo in range(0, 21) for w in range(5, 41))),
    "digit_sum": CodeFamily(_digit_sum, ((),)),
    "factorial": CodeFamily(_factorial, ((),)),
    # strings
    "transform": CodeFamily(_transform, tuple((n,) for n in _TRANSFORMS)),
    "count_char": CodeFamily(_count_char, tuple((c,) for c in string.ascii_lowercase) + (("vowels",),)),
    "repeat": CodeFamily(_repeat, tuple((k,) for k in range(2, 10))),
    "first_n": CodeFamily(_first_n, tuple((n,) for n in range(1, 10))),
    "palindrome": CodeFamily(_palindrome_fn, ((),)),
    # lists
    "list_stat": CodeFamily(_list_stat, tuple((n,) for n in _STATS)),
    "count_above": CodeFamily(_count_above, tuple((k,) for k in range(0, 21))),
    "scale": CodeFamily(_scale, tuple((k,) for k in range(2, 11))),
    "keep_multiples": CodeFamily(_keep_multiples, tuple((k,) for k in range(2, 10))),
}
"""Family name -> generator (``CODE_FAMILIES["add"](rng)`` draws a :class:`CodeSpec`); ``.doc`` is its one line."""

DEFAULT_FAMILIES: tuple[str, ...] = tuple(f for f in CODE_FAMILIES if f != "factorial")
"""Every family but ``factorial`` (11 inputs, so only 11 distinct problems: it cannot fill a large task). The
narrowest, ``mul`` and ``multiple``, have 671 distinct problems each, so the mix fills ~10,000 prompts."""

_MAX_TRIES = 2_000


def _example_text(spec: CodeSpec, args: tuple) -> str:
    call = f"{spec.name}({', '.join(map(repr, args))})"
    return (
        f"Write a Python function `{spec.name}({spec.params})` that returns {spec.returns}. "
        f"For example, {call} returns {spec.ref(*args)!r}."
    )


def _tests(spec: CodeSpec, rng: random.Random, example: tuple, n: int, family: str) -> list[str]:
    """``n`` tests on distinct inputs, none of them the example's."""
    tests: list[str] = []
    seen, tries = {repr(example)}, 0
    while len(tests) < n:
        args = spec.draw(rng, len(tests) + 1)
        tries += 1
        if repr(args) not in seen:
            seen.add(repr(args))
            tests.append(f"assert {spec.name}({', '.join(map(repr, args))}) == {spec.ref(*args)!r}")
        elif tries > _MAX_TRIES:
            raise ValueError(f"code family {family!r} ({spec.name}) has too few distinct inputs for tests_per_prompt={n}")
    return tests


def make_code_task(
    num_prompts: int, seed: int, families: list[str] | tuple[str, ...] | None = None, tests_per_prompt: int = 4
) -> list[dict]:
    """``num_prompts`` distinct problems, prompt i from ``families[i % len(families)]`` (a family named twice gets
    twice the share; ``None``: :data:`DEFAULT_FAMILIES`), each with ``tests_per_prompt`` hidden tests.

    Rows ``{"id": "FAMILY-00017", "problem", "tests", "entry_point"}``; the id's number is the index over the whole
    list, so ids are unique and every result can be broken down by family (:func:`family_of`). Problems are
    distinct as texts (two rows may ask for the same function with different examples and tests). Raises
    ``ValueError`` on an unknown family, ``num_prompts <= 0``, ``tests_per_prompt <= 0``, or a family with too few
    distinct problems or inputs. Deterministic in the arguments.
    """
    families = list(DEFAULT_FAMILIES if families is None else families)
    unknown = [f for f in families if f not in CODE_FAMILIES]
    if unknown or not families:
        raise ValueError(f"unknown code families {unknown or families}; valid: {', '.join(CODE_FAMILIES)}")
    if num_prompts <= 0:
        raise ValueError(f"num_prompts must be positive, got {num_prompts}")
    if tests_per_prompt <= 0:
        raise ValueError(f"tests_per_prompt must be positive, got {tests_per_prompt}")
    rng = random.Random(seed)
    seen: set[str] = set()
    rows = []
    width = max(5, len(str(num_prompts - 1)))
    for i in range(num_prompts):
        fam = families[i % len(families)]
        for _ in range(_MAX_TRIES):
            spec = CODE_FAMILIES[fam](rng)
            example = spec.draw(rng, 0)
            problem = _example_text(spec, example)
            if problem not in seen:
                break
        else:
            raise ValueError(f"code family {fam!r} has too few distinct problems for {num_prompts} prompts")
        seen.add(problem)
        rows.append(
            {
                "id": f"{fam}-{i:0{width}d}",
                "problem": problem,
                "tests": _tests(spec, rng, example, tests_per_prompt, fam),
                "entry_point": spec.name,
            }
        )
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
    """Problem families (graft/data/code_task.py ``CODE_FAMILIES``: add, reverse, list_stat, ...): prompt i comes
    from ``families[i % len(families)]``; ``None``: every family but ``factorial``."""
    tests_per_prompt: int = 4
    """Hidden ``assert f(x) == y`` tests per problem (never the example the problem text shows)."""

    def __post_init__(self) -> None:
        check(self.num_prompts > 0, "num_prompts", f"must be positive, got {self.num_prompts}")
        check(self.families is None or len(self.families) > 0, "families", "must name at least one family (or be null)")
        check(self.tests_per_prompt >= 1, "tests_per_prompt", f"must be >= 1, got {self.tests_per_prompt}")


class CodeTask(Task):
    """``data.train: code_task``: write one small Python function, graded by hidden tests (``reward.domain: code``)."""

    settings = CodeTaskConfig

    def rows(self, settings: CodeTaskConfig) -> list[dict]:
        return make_code_task(settings.num_prompts, settings.seed, settings.families, settings.tests_per_prompt)

    def families(self, settings: CodeTaskConfig) -> list[str]:
        return list(dict.fromkeys(settings.families or DEFAULT_FAMILIES))

    def check(self, cfg: Any) -> None:
        check(
            cfg.reward.domain == "code" or bool(cfg.reward.function),
            "reward.domain",
            f"is {cfg.reward.domain!r} but data.train=code_task has tests, not answers: set reward.domain=code",
        )


TASKS.register("code_task", CodeTask())
