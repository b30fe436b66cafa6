"""The code task's problem families (:data:`graft.registry.CODE_FAMILIES`): each draws a :class:`CodeSpec` -- one
small function to write, its reference implementation, its edge-class inputs and its reference source.

A family registers itself at the end of this module (``CODE_FAMILIES.register("add", CodeFamily(_add, ...))``), and
``data.code_task.families`` takes its name; a family of your own registers the same way from your code
(docs/contributing.md). The task that turns families into rows, and the rules every family follows (what its tests
cover, determinism), are :mod:`graft.data.code_task`'s.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graft.registry import CODE_FAMILIES

Args = tuple
"""The arguments of one call."""


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
    example: Callable[[random.Random], Args]
    """The problem's example call: a typical input, none of the edge classes."""
    edges: Callable[[random.Random], list[Args]]
    """The input classes every row tests, in priority order (values drawn from ``rng`` where a class has many)."""
    draw: Callable[[random.Random], Args]
    """A random input from the whole input space (the tests beyond the edge classes, and the fresh tests)."""
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
BIG = 10**9
"""The largest magnitude of a drawn integer (floats hold every integer up to 2**53 exactly)."""
LOOPED = 10**7
"""The largest magnitude where a correct program may plausibly loop once per unit (a multiplication by repeated
addition, a divisibility test by repeated subtraction): it still ends within the sandbox's time per test."""


def _letters(rng: random.Random, lo: int, hi: int, alphabet: str = string.ascii_lowercase) -> str:
    """``lo..hi`` random characters of ``alphabet``."""
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


def _text(rng: random.Random) -> str:
    """A lowercase word: from :data:`_WORDS` or random letters (3..8), even odds."""
    return rng.choice(_WORDS) if rng.randrange(2) else _letters(rng, 3, 8)


LONG_TEXT, LONG_LIST = (101, 200), (101, 160)
"""The lengths of a long input: past 100 characters and 100 items (a result cut at a round number)."""


def _long_text(rng: random.Random, alphabet: str = string.ascii_lowercase) -> str:
    """A long string (:data:`LONG_TEXT`) of ``alphabet``."""
    return _letters(rng, *LONG_TEXT, alphabet)


def _long_list(rng: random.Random, lo: int = -99, hi: int = 99) -> list[int]:
    """A long list (:data:`LONG_LIST`) of integers in ``lo..hi``."""
    return _ints(rng, lo, hi, *LONG_LIST)


def _wide(rng: random.Random, big: int = BIG) -> int:
    """An integer of random size and sign: below 10, 1000, 10**6 or ``big`` in magnitude, each as likely."""
    mag = rng.choice((10, 1000, 10**6, big))
    return rng.randint(-mag + 1, mag - 1)


def _ints(rng: random.Random, lo: int, hi: int, min_len: int, max_len: int) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(min_len, max_len))]


def _wide_list(rng: random.Random, min_len: int = 0) -> list[int]:
    """A list of random length (``min_len``..12, or 20..60 one time in four) of integers of one random size."""
    n = rng.randint(20, 60) if rng.randrange(4) == 0 else rng.randint(min_len, 12)
    mag = rng.choice((10, 100, 1000, 10**6))
    return [rng.randint(-mag, mag) for _ in range(n)]


def _next(c: str) -> str:
    """The next lowercase letter (``z`` -> ``a``)."""
    return chr((ord(c) - ord("a") + 1) % 26 + ord("a"))


def _palindrome(rng: random.Random, lo: int = 1, hi: int = 4) -> str:
    half = _letters(rng, lo, hi)
    return half + (rng.choice(string.ascii_lowercase) if rng.randrange(2) else "") + half[::-1]


def _not_palindrome(rng: random.Random) -> str:
    s = _text(rng)
    return _next(s[-1]) + s[1:] if s[0] == s[-1] else s  # first and last letters differ afterwards


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
        lambda rng: (rng.randint(1, 99),),
        # 0 (x * k, x - k), -k (sum 0), negatives (abs, max(x, 0)), sizes far beyond a lookup table over 0..99
        lambda rng: [(0,), (-k,), (-1,), (rng.randint(-99, -2),), (rng.randint(10**8, BIG),), (rng.randint(-BIG, -(10**8)),)],
        lambda rng: (_wide(rng),),
        f"def add_{k}(x):\n    return x + {k}\n",
    )


def _mul(k: int) -> CodeSpec:
    """times_k(x) returns x * k, for k in 2..12."""
    return CodeSpec(
        f"times_{k}",
        "x",
        f"x times {k}",
        lambda x: x * k,
        lambda rng: (rng.randint(2, 60),),
        # 0 and 1 (x + k, x ** k), negatives (repeated addition over range(x), abs), sizes beyond a table
        lambda rng: [
            (0,),
            (1,),
            (-1,),
            (rng.randint(-60, -2),),
            (rng.randint(10**4, LOOPED // k),),
            (rng.randint(-LOOPED // k, -(10**4)),),
        ],
        lambda rng: (_wide(rng, LOOPED) // k,),
        f"def times_{k}(x):\n    return x * {k}\n",
    )


def _multiple(k: int) -> CodeSpec:
    """is_multiple_of_k(n) returns whether k divides n (k in 2..12; k = 2 is "is even"); tests True and False alike."""
    # p, q: the smallest and largest prime factors of k. For composite k the False inputs k // q and k * m + k // p
    # hold every proper divisor of k between them (12: 4 and 12m + 6), so `n % d == 0` fails for each divisor d.
    p = next(d for d in range(2, k + 1) if k % d == 0)
    q = next(d for d in range(k, 1, -1) if k % d == 0 and all(d % e for e in range(2, d)))

    def edges(rng: random.Random) -> list[Args]:
        r = rng.randint(1, k - 1)
        m = next(x for x in range(rng.randint(2, 60), 200) if x % (k + 1) and (k < 3 or x % (k - 1)))  # not k +- 1
        return [
            (0,),  # divisible by every k
            (1,),  # the remainders 1 and k - 1 (off by one from a multiple), above and below 0
            (-1,),
            (k // q if q < k else r,),  # a positive n below k: `n // k == 0` says True
            (-k,),  # a negative multiple: `n > 0` guards
            (k - 1,),
            (k + 1,),
            (k * m,),  # a multiple of k, not of k - 1 or k + 1
            (k * m + (k // p if p < k else r),),
            (k * (2 * rng.randint(10**6 // (2 * k) + 1, LOOPED // (2 * k)) - 1),),  # 10**6 and more, odd for odd k
            (k * rng.randint(10**4, LOOPED // k) + r,),
            (k * next(x for x in range(rng.randint(61, 400), 500) if x % 5),),  # one more, its last digit not 0 or 5
        ]

    return CodeSpec(
        f"is_multiple_of_{k}",
        "n",
        f"True if the integer n is divisible by {k}, and False otherwise",
        lambda n: n % k == 0,
        lambda rng: (k * rng.randint(2, 60) + rng.choice((0, rng.randint(1, k - 1))),),
        edges,
        lambda rng: (k * (_wide(rng, LOOPED) // k) + rng.choice((0, 0, rng.randint(1, k - 1))),),
        f"def is_multiple_of_{k}(n):\n    return n % {k} == 0\n",
    )


def _distance(k: int) -> CodeSpec:
    """distance_from_k(x) returns abs(x - k), for k in 1..60."""
    return CodeSpec(
        f"distance_from_{k}",
        "x",
        f"the absolute difference between the integer x and {k}",
        lambda x: abs(x - k),
        lambda rng: (rng.randint(k + 2, k + 30) if k < 3 or rng.randrange(2) else rng.randint(max(1, k - 30), k - 2),),
        # x = k and its neighbours, 0, -k and other negatives (abs(x) - k, abs(abs(x) - k)), far on both sides
        lambda rng: [
            (k,),
            (k + 1,),
            (k - 1,),
            (0,),
            (-k,),
            (rng.randint(-1000, -1),),
            (rng.randint(10**8, BIG),),
            (rng.randint(-BIG, -(10**8)),),
        ],
        lambda rng: (_wide(rng),),
        f"def distance_from_{k}(x):\n    return abs(x - {k})\n",
    )


def _clamp(lo: int, hi: int) -> CodeSpec:
    """clamp_lo_hi(x) returns x limited to [lo, hi] (0 <= lo <= 20, hi - lo in 5..40)."""
    return CodeSpec(
        f"clamp_{lo}_{hi}",
        "x",
        f"the integer x limited to the range {lo} to {hi}: {lo} when x is less "
        f"than {lo}, {hi} when x is greater than {hi}, and x itself otherwise",
        lambda x: min(max(x, lo), hi),
        lambda rng: (rng.choice((rng.randint(lo + 2, hi - 2), rng.randint(lo - 30, lo - 2), rng.randint(hi + 2, hi + 30))),),
        # each bound and both its neighbours, inside, and far outside on both sides
        lambda rng: [
            (lo,),
            (hi,),
            (lo - 1,),
            (hi + 1,),
            (lo + 1,),
            (hi - 1,),
            (rng.randint(lo + 2, hi - 2),),
            (rng.randint(-BIG, -(10**8)),),
            (rng.randint(10**8, BIG),),
        ],  # fmt: skip
        lambda rng: (_wide(rng),),
        f"def clamp_{lo}_{hi}(x):\n    if x < {lo}:\n        return {lo}\n    if x > {hi}:\n        return {hi}\n    return x\n",
    )


def _digit_sum() -> CodeSpec:
    """sum_of_digits(n) returns the sum of the decimal digits of n >= 0 (one function)."""

    def edges(rng: random.Random) -> list[Args]:
        # 0, one digit, 9 (n % 9), 10, a digit sum >= 24 (the digital root, n % 10 + n // 10), inner zeros, 10..15
        # digits (a sum over the first few digits only)
        return [
            (0,),
            (9,),
            (rng.randint(1, 8),),
            (10,),
            (rng.randint(1, 999) * 1000 + 789,),
            (10 ** rng.randint(4, 8) + rng.randint(1, 9),),
            (rng.randint(10**9, 10**15),),
            (rng.randint(11, 99),),
        ]

    return CodeSpec(
        "sum_of_digits",
        "n",
        "the sum of the decimal digits of the non-negative integer n",
        lambda n: sum(int(d) for d in str(n)),
        lambda rng: (rng.randint(100, 99999),),
        edges,
        lambda rng: (rng.randint(0, 10 ** rng.randint(1, 15)),),
        "def sum_of_digits(n):\n    total = 0\n    while n > 0:\n        total += n % 10\n        n //= 10\n    return total\n",
    )


def _factorial() -> CodeSpec:
    """factorial(n) returns n! for n >= 0 (one function; examples 3..10: 8 problems, not in the default mix)."""

    def ref(n):
        out = 1
        for i in range(2, n + 1):
            out *= i
        return out

    return CodeSpec(
        "factorial",
        "n",
        "the factorial of the integer n >= 0, that is 1 * 2 * ... * n (and 1 when n is 0)",
        ref,
        lambda rng: (rng.randint(3, 10),),
        # 0 (a recursion whose only base case is 1), 1, 2, and past a lookup table over 0..10 or float precision
        lambda rng: [(0,), (1,), (2,), (rng.randint(11, 17),), (rng.randint(18, 25),), (rng.randint(26, 30),)],
        lambda rng: (rng.randint(0, 30),),
        "def factorial(n):\n    result = 1\n    for i in range(1, n + 1):\n        result *= i\n    return result\n",
    )


# ----------------------------------------------------------------------------- string families


def _odd_text(rng: random.Random) -> str:
    """Letters, digits, spaces and punctuation in mixed case (a string that is not one lowercase word)."""
    return _letters(rng, 4, 12, string.ascii_letters + string.digits + " .,!-")


def _string_edges(case: str) -> Callable[[random.Random], list[Args]]:
    """The inputs of a fixed string function: '', one character, a word starting with a capital, an all-capital
    word, mixed case with digits and punctuation, two words, a long string of mixed case (``case`` picks the
    word's case)."""

    def edges(rng: random.Random) -> list[Args]:
        word = _text(rng)
        first = word if case == "lower" else word[0].upper() + word[1:]
        return [
            ("",),
            (rng.choice(string.ascii_letters),),
            (first,),
            (word.upper() if case != "upper" else _text(rng),),
            (_odd_text(rng),),
            (f"{_text(rng)} {_mixed_case(rng)}",),
            (_long_text(rng, string.ascii_letters + " "),),
            (f" {_mixed_case(rng)} ",),  # spaces at both ends: a result stripped of them
        ]

    return edges


_TRANSFORMS: dict[str, tuple[str, Callable[[str], str], str, str]] = {
    "reverse_string": ("the string s reversed", lambda s: s[::-1], "s[::-1]", "any"),
    "to_upper": ("the string s with every letter in upper case", str.upper, "s.upper()", "upper"),
    "to_lower": ("the string s with every letter in lower case", str.lower, "s.lower()", "lower"),
}
"""Per function: what it returns, the reference, the reference solution's expression, and which case its
typical input has."""


def _transform(name: str) -> CodeSpec:
    """reverse_string(s), to_upper(s) or to_lower(s): one of three fixed string functions."""
    returns, ref, expr, case = _TRANSFORMS[name]
    return CodeSpec(
        name,
        "s",
        returns,
        ref,
        lambda rng: (_mixed_case(rng) if case == "lower" else _text(rng),),
        _string_edges(case),
        lambda rng: (rng.choice((_text(rng), _odd_text(rng), _letters(rng, 0, 150, string.ascii_letters + " "))),),
        f"def {name}(s):\n    return {expr}\n",
    )


def _sprinkle(rng: random.Random, s: str, c: str, times: int) -> str:
    """``s`` with ``times`` more ``c`` at random places."""
    for _ in range(times):
        i = rng.randint(0, len(s))
        s = s[:i] + c + s[i:]
    return s


def _count_char(c: str) -> CodeSpec:
    """count_c(s) returns how many times the letter c appears in s (26 letters), or count_vowels(s) (c = "vowels")."""
    if c == "vowels":
        return _count_vowels()
    other = _next(c)

    def edges(rng: random.Random) -> list[Args]:
        # '' and a string without c (0), c alone, c 4..7 times (min(count, 3)), c at both ends, only c's, long,
        # words with spaces and digits (a count over letters-only strings)
        plain = _text(rng).replace(c, other)
        return [
            ("",),
            (plain,),
            (c,),
            (_sprinkle(rng, plain, c, rng.randint(4, 7)),),
            (c + _text(rng).replace(c, other) + c,),
            (c * rng.randint(2, 9),),
            (_sprinkle(rng, _long_text(rng).replace(c, other), c, rng.randint(8, 20)),),
            (f"{_text(rng).replace(c, other)} {c} {rng.randint(10, 99)} {c}",),
        ]

    return CodeSpec(
        f"count_{c}",
        "s",
        f"the number of times the letter '{c}' appears in the string s",
        lambda s: s.count(c),
        lambda rng: (_sprinkle(rng, _text(rng).replace(c, other), c, rng.randint(1, 3)),),
        edges,
        lambda rng: (_sprinkle(rng, _letters(rng, 0, 80), c, rng.randint(0, 12)),),
        f"def count_{c}(s):\n    return s.count('{c}')\n",
    )


def _count_vowels() -> CodeSpec:
    def edges(rng: random.Random) -> list[Args]:
        # '', no vowel (and y), 'uyu' (y counted, u missed), every vowel, vowels repeated (distinct ones), long, one
        # vowel, words with spaces
        return [
            ("",),
            (_letters(rng, 3, 8, "bcdfghjklmnpqrstvwxyz"),),
            (_text(rng) + "uyu",),
            ("".join(rng.sample(_VOWELS, 5)),),
            (rng.choice(_VOWELS) * rng.randint(3, 6) + _text(rng),),
            (_long_text(rng),),
            (rng.choice(_VOWELS),),
            (f"{_text(rng)} {_text(rng)} {_text(rng)}",),
        ]

    return CodeSpec(
        "count_vowels",
        "s",
        "the number of vowels (a, e, i, o, u) in the lowercase string s",
        lambda s: sum(ch in _VOWELS for ch in s),
        lambda rng: (_text(rng),),
        edges,
        lambda rng: (_letters(rng, 0, 100),),
        "def count_vowels(s):\n    return sum(1 for ch in s if ch in 'aeiou')\n",
    )


def _repeat(k: int) -> CodeSpec:
    """repeat_k(s) returns s written k times in a row, for k in 2..9."""
    return CodeSpec(
        f"repeat_{k}",
        "s",
        f"the string s repeated {k} times, joined into one string",
        lambda s: s * k,
        lambda rng: (_letters(rng, 2, 4),),
        # '', one character, a word, words with spaces (one at the end: a result stripped), a long string (a result cut)
        lambda rng: [
            ("",),
            (rng.choice(string.ascii_lowercase),),
            (_text(rng),),
            (f"{_text(rng)} {_text(rng)} ",),
            (_long_text(rng),),
        ],
        lambda rng: (_letters(rng, 0, 60, string.ascii_lowercase + " "),),
        f"def repeat_{k}(s):\n    return s * {k}\n",
    )


def _first_n(n: int) -> CodeSpec:
    """first_n(s) returns the first n characters of s, all of s if shorter (n in 1..9)."""

    def longer(rng: random.Random, lo: int, hi: int) -> str:
        s = _letters(rng, lo, hi)
        return s[:-1] + _next(s[-1]) if s[-n:] == s[:n] else s  # its end differs from its start: s[-n:] fails

    def edges(rng: random.Random) -> list[Args]:
        # '' (s[0] + s[1:n]), exactly n, one longer, long, shorter by one, one character, two words
        out = [
            ("",),
            (_letters(rng, n, n),),
            (longer(rng, n + 1, n + 1),),
            (longer(rng, *LONG_TEXT),),
            (longer(rng, n + 2, n + 6),),
        ]
        out += [(_letters(rng, n - 1, n - 1),), (_letters(rng, 1, 1),)] if n > 1 else []
        return out + [(f" {_letters(rng, n + 2, n + 6)}",)]  # a space first: the first word, a result stripped

    returns = (
        "the first character of the string s (the empty string when s is empty)"
        if n == 1
        else f"the first {n} characters of the string s (all of s when s is shorter than {n} characters)"
    )
    return CodeSpec(
        f"first_{n}",
        "s",
        returns,
        lambda s: s[:n],
        lambda rng: (longer(rng, n + 2, n + 6),),
        edges,
        lambda rng: (_letters(rng, 0, 2 * n + 10),),
        f"def first_{n}(s):\n    return s[:{n}]\n",
    )


def _near_palindrome(rng: random.Random, lo: int, hi: int) -> str:
    """w + w[::-1] with one pair of letters in its inner half made to differ: the ends match, a check of the first
    few pairs says True."""
    half = _letters(rng, lo, hi)
    s = list(half + half[::-1])
    i = rng.randint(len(half) // 2, len(half) - 1)
    s[i] = _next(s[i])
    return "".join(s)


def _palindrome_edges(rng: random.Random) -> list[Args]:
    # '', one letter, two equal and two different letters, even and odd palindromes, the middle pair differing,
    # equal ends around a non-palindrome, long palindromes and near palindromes (a check of the first few pairs)
    a = rng.choice(string.ascii_lowercase)
    half = _letters(rng, 2, 4)
    s = _not_palindrome(rng)
    return [
        ("",),
        (a,),
        (a + a,),
        (a + _next(a),),
        (half + half[::-1],),
        (half + _next(half[-1]) + half[::-1],),
        (s + _next(s[-1]) + s[-2::-1],),
        (a + s + a,),
        (_palindrome(rng, 15, 40),),
        (_near_palindrome(rng, 15, 40),),
        (_not_palindrome(rng),),
    ]


def _palindrome_fn() -> CodeSpec:
    """is_palindrome(s) returns whether s reads the same backwards (one function); tests True and False alike."""
    return CodeSpec(
        "is_palindrome",
        "s",
        "True if the lowercase string s reads the same forwards and backwards, and False otherwise",
        lambda s: s == s[::-1],
        lambda rng: (rng.choice((_palindrome(rng, 2, 4), _not_palindrome(rng))),),
        _palindrome_edges,
        lambda rng: (rng.choice((_palindrome(rng, 1, 40), _near_palindrome(rng, 1, 40), _letters(rng, 0, 40))),),
        "def is_palindrome(s):\n    return s == s[::-1]\n",
    )


# ----------------------------------------------------------------------------- list families


def _sum_list_edges(rng: random.Random) -> list[Args]:
    # [] (nums[0] + ...), one element, all negative (abs, positives only), a repeated value (sum of a set), long
    # lists (a sum over the first few), large values, a list summing to 0, 1 over 49 items (a sum through the
    # mean: 1 / 49 * 49 is 0.999...)
    v = _ints(rng, -50, 50, 3, 6)
    x = rng.randint(1, 99)
    return [([],), ([rng.randint(-99, 99)],), ([-abs(e) - 1 for e in v],), (v + [v[0], x, x],), (_long_list(rng),),
            (_ints(rng, -BIG, BIG, 2, 6),), ([x, -x],), ([0] * 48 + [1],)]  # fmt: skip


def _max_of_list_edges(rng: random.Random) -> list[Args]:
    # one negative element, all negative with the maximum last (m = 0 to start, nums[0]), the maximum first (nums[-1]),
    # the maximum twice, long with the maximum past the first few, large negative values, the maximum second (a
    # maximum over every other element), two items
    v = _ints(rng, -50, 50, 3, 6)
    neg = [e - 52 for e in v]
    long = _long_list(rng)
    long.insert(rng.randint(8, len(long)), 100)
    return [([rng.randint(-99, -1)],), (neg + [max(neg) + 1],), ([max(v) + 1, *v],), (v + [max(v) + 5, max(v) + 5],), (long,),
            (_ints(rng, -BIG, -1, 2, 6),), ([v[0], max(v) + 3, *v[1:]],), ([v[0], v[0] + rng.randint(1, 9)],)]  # fmt: skip


def _list_length_edges(rng: random.Random) -> list[Args]:
    # [] and one and two items, repeats side by side and 0 (len(set(items)), a count of truthy items), long lists
    # (a length capped at some round number), words
    v = _ints(rng, -9, 50, 2, 6)
    return [
        ([],),
        ([rng.randint(-9, 50)],),
        ([v[0], v[0] + 1],),
        (v + [v[-1], 0, 0],),
        (_long_list(rng, -9, 9),),
        ([_text(rng) for _ in range(rng.randint(2, 6))],),
    ]


def _last_element_edges(rng: random.Random) -> list[Args]:
    # one and two items, a last value that is neither the first, the largest nor the smallest, long lists, words
    v = _ints(rng, -9, 50, 2, 6)
    return [([rng.randint(-9, 50)],), ([v[0] - 1, *v[1:], v[0] + 1, v[0]],), (_long_list(rng),),
            ([_text(rng) for _ in range(rng.randint(2, 6))],), ([v[0] + 1, v[0]],)]  # fmt: skip


@dataclass(frozen=True)
class _Stat:
    """One fixed list function: its parameter, what it returns (the prompt's words), the reference, the shortest
    list it takes, the reference solution's expression, and its edge inputs."""

    param: str
    returns: str
    ref: Callable[..., Any]
    min_len: int
    expr: str
    edges: Callable[[random.Random], list[Args]]


_STATS: dict[str, _Stat] = {
    "sum_list": _Stat(
        "nums", "the sum of the integers in the list nums (0 when nums is empty)", sum, 0, "sum(nums)", _sum_list_edges
    ),
    "max_of_list": _Stat("nums", "the largest integer in the non-empty list nums", max, 1, "max(nums)", _max_of_list_edges),
    "list_length": _Stat("items", "the number of elements in the list items", len, 0, "len(items)", _list_length_edges),
    "last_element": _Stat(
        "items", "the last element of the non-empty list items", lambda v: v[-1], 1, "items[-1]", _last_element_edges
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
        lambda rng: (_ints(rng, -9, 50, max(2, st.min_len), 6),),
        st.edges,
        lambda rng: (_wide_list(rng, st.min_len),),
        f"def {name}({st.param}):\n    return {st.expr}\n",
    )


def _count_above(k: int) -> CodeSpec:
    """count_greater_than_k(nums) returns how many integers of nums exceed k, for k in 0..20 (0: count positives)."""

    def edges(rng: random.Random) -> list[Args]:
        # [], k alone, k + 1 alone, [k + 1, ..., k] (>=, > k + 1), nothing above k, values far above k (a window
        # k < v <= k + 10) and far below, a value above k repeated (a count of distinct values), all but one above
        # (a count over some of the list), long lists
        nums = _ints(rng, k - 10, k + 10, 3, 7)
        far = [rng.randint(k + 100, k + 1000), rng.randint(k + 11, k + 1000), rng.randint(-1000, k - 11)]
        rng.shuffle(far)
        up = rng.randint(k + 1, k + 9)
        return [([],), ([k],), ([k + 1],), ([k + 1, *nums[1:-1], k],), ([min(v, 2 * k - v) for v in nums],), (far,),
                (nums + [up, up, up],), ([k, *(up + i for i in range(rng.randint(3, 6)))],),
                (_long_list(rng, k - 50, k + 50),)]  # fmt: skip

    return CodeSpec(
        f"count_greater_than_{k}",
        "nums",
        f"how many integers in the list nums are greater than {k}",
        lambda nums: sum(v > k for v in nums),
        lambda rng: (_ints(rng, k - 10, k + 10, 3, 7),),
        edges,
        lambda rng: ([k + e for e in _wide_list(rng)],),
        f"def count_greater_than_{k}(nums):\n    count = 0\n    for v in nums:\n        if v > {k}:\n"
        "            count += 1\n    return count\n",
    )


def _scale(k: int) -> CodeSpec:
    """multiply_each_by_k(nums) returns [v * k for v in nums], for k in 2..10 (2: double each)."""

    def edges(rng: random.Random) -> list[Args]:
        # [], one element, the largest first and a negative last (sorted, abs), zeros and repeats side by side (a
        # filter, a set, adjacent duplicates dropped), -1, 0 and 1, long lists (a result cut short), large values
        nums = _ints(rng, -5, 20, 2, 5)
        return [([],), ([rng.randint(-20, 20)],), ([max(nums) + 1, *nums, -abs(nums[0]) - 1],),
                ([0, 0, *nums, nums[0], nums[0]],), ([-1, 0, 1],), (_long_list(rng),),
                (_ints(rng, -BIG // k, BIG // k, 2, 6),)]  # fmt: skip

    return CodeSpec(
        f"multiply_each_by_{k}",
        "nums",
        f"a new list holding each integer of the list nums multiplied by {k}, in the same order",
        lambda nums: [v * k for v in nums],
        lambda rng: (_ints(rng, 1, 20, 2, 5),),
        edges,
        lambda rng: ([v // k for v in _wide_list(rng)],),
        f"def multiply_each_by_{k}(nums):\n    return [v * {k} for v in nums]\n",
    )


def _keep_multiples(k: int) -> CodeSpec:
    """keep_multiples_of_k(nums) returns the integers of nums divisible by k, in order (k in 2..9; 2: the evens)."""

    def edges(rng: random.Random) -> list[Args]:
        # [], none divisible ([]), all divisible (6..9 of them: a result cut short), [m, ..., m - k, m - k] (sorted,
        # a set, the list read backwards), 0 (divisible by every k), negative and large multiples of both signs,
        # long lists
        m = k * rng.randint(2, 40 // k + 2)
        none = [k * rng.randint(0, 9) + rng.randint(1, k - 1) for _ in range(rng.randint(2, 5))]
        return [([],), (none,), ([k * rng.randint(-9, 9) for _ in range(rng.randint(6, 9))],),
                ([m, *none[:2], m - k, m - k],), ([*none[:2], 0, k * rng.randint(1, 9)],),
                ([-k * rng.randint(1, 20), *none[:1], -k, k, k * rng.randint(100, 10**5), -k * rng.randint(100, 10**5)],),
                (_long_list(rng),)]  # fmt: skip

    return CodeSpec(
        f"keep_multiples_of_{k}",
        "nums",
        f"a list of the integers in the list nums that are divisible by {k}, in their original order",
        lambda nums: [v for v in nums if v % k == 0],
        lambda rng: ([k * rng.randint(1, 9), *_ints(rng, 1, 40, 2, 5)],),
        edges,
        lambda rng: (_wide_list(rng),),
        f"def keep_multiples_of_{k}(nums):\n    return [v for v in nums if v % {k} == 0]\n",
    )


# ----------------------------------------------------------------------------- the families, in this order

CODE_FAMILIES.register("add", CodeFamily(_add, tuple((k,) for k in range(1, 100))))
CODE_FAMILIES.register("mul", CodeFamily(_mul, tuple((k,) for k in range(2, 13))))
CODE_FAMILIES.register("multiple", CodeFamily(_multiple, tuple((k,) for k in range(2, 13))))
CODE_FAMILIES.register("distance", CodeFamily(_distance, tuple((k,) for k in range(1, 61))))
CODE_FAMILIES.register("clamp", CodeFamily(_clamp, tuple((lo, lo + w) for lo in range(0, 21) for w in range(5, 41))))
CODE_FAMILIES.register("digit_sum", CodeFamily(_digit_sum, ((),)))
CODE_FAMILIES.register("factorial", CodeFamily(_factorial, ((),)))
CODE_FAMILIES.register("transform", CodeFamily(_transform, tuple((n,) for n in _TRANSFORMS)))
CODE_FAMILIES.register("count_char", CodeFamily(_count_char, tuple((c,) for c in string.ascii_lowercase) + (("vowels",),)))
CODE_FAMILIES.register("repeat", CodeFamily(_repeat, tuple((k,) for k in range(2, 10))))
CODE_FAMILIES.register("first_n", CodeFamily(_first_n, tuple((n,) for n in range(1, 10))))
CODE_FAMILIES.register("palindrome", CodeFamily(_palindrome_fn, ((),)))
CODE_FAMILIES.register("list_stat", CodeFamily(_list_stat, tuple((n,) for n in _STATS)))
CODE_FAMILIES.register("count_above", CodeFamily(_count_above, tuple((k,) for k in range(0, 21))))
CODE_FAMILIES.register("scale", CodeFamily(_scale, tuple((k,) for k in range(2, 11))))
CODE_FAMILIES.register("keep_multiples", CodeFamily(_keep_multiples, tuple((k,) for k in range(2, 10))))
