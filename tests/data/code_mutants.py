"""The mutant suite of the built-in code task: for every family, plausible WRONG programs (off-by-one constants,
strict instead of non-strict bounds, sign errors, truncations, crashes on empty input, wrong types, lookup tables
over a small input range, answers that fit the prompt's example, shortcuts that ignore the input) and correct
programs written in other idioms. A row's hidden tests must reject the first and pass the second.

:func:`mutants` and :func:`variants` give ``{label: program source}`` for one row of ``make_code_task``;
:func:`rewarded` grades a program the way the code reward does (each call's value through ``repr`` and
``ast.literal_eval``, strict comparison :func:`graft.reward.asserts.same`), in this process: these are our own
trusted programs, so a plain exec, each call under a time limit. Used by tests/data/test_code_task.py and by
``results/code/kill_rates.py``.
"""

from __future__ import annotations

import ast
import re
import signal
from contextlib import contextmanager

from graft.data.code_task import spec_of
from graft.reward.asserts import parse_tests, same as _same

CALL_LIMIT_S = 1.0
"""In-process time limit of one call (the sandbox's ``test_timeout_s`` is 3 s): past it the call fails."""

EXAMPLE_RE = re.compile(r"For example, (\w+)\((.*)\) returns (.+)\.$")


@contextmanager
def _limit(seconds: float):
    def stop(signum, frame):
        raise TimeoutError

    old = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def rewarded(program: str, tests: list[str]) -> bool:
    """Whether ``program`` passes every test of ``tests`` (strings ``assert CALL == LITERAL``)."""
    namespace: dict = {}
    try:
        with _limit(CALL_LIMIT_S):
            exec(program, namespace)
    except Exception:
        return False
    for case in parse_tests(tests):
        try:
            with _limit(CALL_LIMIT_S):
                value = ast.literal_eval(repr(eval(case.call, namespace)))
        except Exception:  # raised, timed out, or no literal (a map object): that test fails
            return False
        if not _same(case.expected, value):
            return False
    return True


def _example(row: dict) -> tuple[str, str]:
    """(the example call's arguments, its value) as the prompt writes them."""
    _, args, value = EXAMPLE_RE.search(row["problem"]).groups()
    return args, value


def shortcuts(row: dict) -> dict[str, str]:
    """Programs that ignore the input: a constant (of every type, and the prompt's example value), the first
    argument itself, or the example's answer for the example's input and a constant otherwise."""
    name = row["entry_point"]
    args, value = _example(row)
    out = {
        f"returns {c}": f"def {name}(*args):\n    return {c}\n" for c in ("None", "True", "False", "0", "1", "''", "[]", "args[0]")
    }
    out["returns the example's value"] = f"def {name}(*args):\n    return {value}\n"
    out["example only"] = f"def {name}(*args):\n    if args == ({args},):\n        return {value}\n    return args[0]\n"
    return out


def _k(row: dict) -> int:
    tail = row["entry_point"].rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else 0


# ----------------------------------------------------------------------------- wrong programs, per family
# Each returns (parameter, {label: body}); a body is one expression (returned) or several lines (a function body).


def _add(row):
    k = _k(row)
    table = ", ".join(f"{i}: {i + k}" for i in range(100))
    return "x", {
        "k + 1": f"x + {k + 1}", "k - 1": f"x + {k - 1}", "minus": f"x - {k}", "times": f"x * {k}", "k - x": f"{k} - x",
        "abs": f"abs(x) + {k}", "max 0": f"max(x, 0) + {k}", "abs sum": f"abs(x + {k})", "negatives 0": f"x + {k} if x >= 0 else 0",
        "table 0..99": f"{{{table}}}.get(x, 0)", "small only": f"x + {k} if -1000 < x < 1000 else x", "float": f"float(x + {k})",
        "str": f"str(x + {k})", "or": f"x | {k}", "xor": f"x ^ {k}", "zero is zero": f"x + {k} if x else 0",
        "off for negatives": f"x + {k} + (x < 0)", "sign flip below -k": f"x + {k} if x >= -{k} else -(x + {k})",
        "floor 0": f"max(x + {k}, 0)", "under a million": f"x + {k} if abs(x) < 10**6 else 0",
    }  # fmt: skip


def _mul(row):
    k = _k(row)
    return "x", {
        "k + 1": f"x * {k + 1}", "k - 1": f"x * {k - 1}", "plus": f"x + {k}", "power": f"x ** {k}", "abs": f"abs(x) * {k}",
        "repeated addition": f"total = 0\n    for _ in range(x):\n        total += {k}\n    return total",
        "positives only": f"x * {k} if x > 0 else 0", "small only": f"x * {k} if abs(x) < 1000 else x",
        "table 0..60": f"[i * {k} for i in range(61)][x]", "float": f"float(x * {k})", "square plus": f"x * x + {k}",
        "minus one": f"x * {k} - 1", "sign error": f"x * {k} if x >= 0 else -x * {k}", "32 bits": f"(x * {k}) & 0xFFFFFFFF",
        "zero is k": f"x * {k} if x else {k}",
    } | ({"shift": f"x << {k - 1}"} if k != 2 else {})  # fmt: skip


def _multiple(row):
    k = _k(row)
    m = {
        "k + 1": f"n % {k + 1} == 0", "negated": f"n % {k} != 0", "zero is not": f"n % {k} == 0 and n > 0",
        "nonzero": f"n % {k} == 0 and n != 0", "below k": f"n % {k} == 0 or n // {k} == 0", "int": f"n % {k}",
        "int bool": f"int(n % {k} == 0)", "negatives False": f"n % {k} == 0 if n >= 0 else False",
        "small only True": f"n % {k} == 0 if abs(n) < 1000 else True", "small only False": f"n % {k} == 0 if abs(n) < 1000 else False",
        "last digit": f"str(n).endswith('{k}')", "greater": f"n > {k}", "remainder 1": f"n % {k} <= 1",
        "str": f"str(n % {k} == 0)", "or one": f"n % {k} == 0 or n == 1", "zero False": f"n % {k} == 0 if n else False",
        "not k squared": f"n % {k} == 0 and n % {k * k} != 0",
    }  # fmt: skip
    if k > 2:
        m["k - 1"] = f"n % {k - 1} == 0"
        m["even"] = "n % 2 == 0"
    if k & (k - 1):  # not a power of two: the bit trick is wrong
        m["bit trick"] = f"n & {k - 1} == 0"
    m.update({f"divisor {d}": f"n % {d} == 0" for d in range(2, k) if k % d == 0})
    m.update({f"multiple {d}": f"n % {d} == 0" for d in (2 * k, 3 * k)})
    return "n", m


def _distance(row):
    k = _k(row)
    return "x", {
        "x - k": f"x - {k}", "k - x": f"{k} - x", "abs(x) - k": f"abs(x) - {k}", "abs(abs(x) - k)": f"abs(abs(x) - {k})",
        "k + 1": f"abs(x - {k + 1})", "k - 1": f"abs(x - {k - 1})", "squared": f"(x - {k}) ** 2", "plus": f"abs(x + {k})",
        "floor 0": f"max(x - {k}, 0)", "negatives": f"abs(x - {k}) if x >= 0 else {k} - abs(x)", "small only": f"abs(x - {k}) % 1000",
        "x - k or x": f"x - {k} if x >= {k} else x", "float": f"float(abs(x - {k}))", "plus one": f"abs(x - {k}) + 1",
        "negatives k": f"abs(x - {k}) if x > 0 else {k}", "math.dist": f"__import__('math').dist([x], [{k}])",
    }  # fmt: skip


def _clamp(row):
    lo, hi = map(int, row["entry_point"].split("_")[1:])
    return "x", {
        "hi - 1": f"min(max(x, {lo}), {hi - 1})", "hi + 1": f"min(max(x, {lo}), {hi + 1})", "lo + 1": f"min(max(x, {lo + 1}), {hi})",
        "lo - 1": f"min(max(x, {lo - 1}), {hi})", "swapped": f"max(min(x, {lo}), {hi})", "lo outside": f"x if {lo} <= x <= {hi} else {lo}",
        "hi outside": f"x if {lo} <= x <= {hi} else {hi}", "no upper": f"max(x, {lo})", "no lower": f"min(x, {hi})",
        "strict inside": f"x if {lo} < x < {hi} else {lo}", "exclusive": f"{lo + 1} if x <= {lo} else {hi - 1} if x >= {hi} else x",
        "hi at hi - 1": f"{lo} if x < {lo} else {hi} if x >= {hi - 1} else x", "middle": f"x if {lo} <= x <= {hi} else {(lo + hi) // 2}",
        "small only": f"min(max(x, {lo}), {hi}) if abs(x) < 1000 else x", "mirror": f"{lo} if x < {lo} else {hi} if x > {hi} else {lo + hi} - x",
        "float": f"float(min(max(x, {lo}), {hi}))", "range": f"x if x in range({lo}, {hi}) else {lo}",
        "hi exclusive": f"{lo} if x < {lo} else min(x, {hi - 1})",
    }  # fmt: skip


def _digit_sum(row):
    return "n", {
        "mod 9": "n % 9", "digital root": "0 if n == 0 else 1 + (n - 1) % 9", "two digits": "n % 10 + n // 10",
        "last two": "n % 10 + n // 10 % 10", "length": "len(str(n))", "last digit": "n % 10",
        "first six": "sum(int(d) for d in str(n)[:6])", "drops first": "sum(int(d) for d in str(n)[1:])",
        "drops last": "total = 0\n    while n > 9:\n        total += n % 10\n        n //= 10\n    return total",
        "mod 10": "sum(map(int, str(n))) % 10", "ends": "int(str(n)[0]) + int(str(n)[-1])", "squares": "sum(int(d) ** 2 for d in str(n))",
        "small only": "sum(map(int, str(n))) if n < 10**6 else 0", "product": "__import__('math').prod(map(int, str(n)))",
        "str": "str(sum(map(int, str(n))))", "zero is 1": "sum(map(int, str(n))) if n > 0 else 1",
    }  # fmt: skip


def _factorial(row):
    return "n", {
        "(n - 1)!": "__import__('math').prod(range(1, n))", "n": "n", "(n + 1)!": "__import__('math').prod(range(1, n + 2))",
        "no base case 0": "1 if n == 1 else n * factorial(n - 1)",
        "table 0..10": "[1, 1, 2, 6, 24, 120, 720, 5040, 40320, 362880, 3628800][n]", "gamma": "__import__('math').gamma(n)",
        "gamma float": "__import__('math').gamma(n + 1)", "int gamma": "int(__import__('math').gamma(n + 1))",
        "power of two": "2 ** n", "n times n - 1": "n * (n - 1) if n > 1 else 1", "zero is 0": "__import__('math').factorial(n) if n else 0",
        "up to 20": "__import__('math').factorial(n) if n <= 20 else 0", "base n": "n * factorial(n - 1) if n > 1 else n",
    }  # fmt: skip


def _reverse(row):
    return "s", {
        "drops first": "s[-1:0:-1]", "rotated": "s[1:] + s[:1]", "sorted": "''.join(sorted(s, reverse=True))", "same": "s",
        "cut": "s[::-1][:20]", "word order": "' '.join(s.split()[::-1])", "each word": "' '.join(w[::-1] for w in s.split())",
        "lower": "s[::-1].lower()", "stripped": "s.strip()[::-1]", "one char empty": "s[::-1] if len(s) > 1 else ''",
        "list": "list(s[::-1])", "swapped ends": "s[-1:] + s[1:-1] + s[:1] if len(s) > 1 else s",
        "empty None": "s[::-1] if s else None", "no spaces": "s[::-1].replace(' ', '')", "lowered": "''.join(reversed(s.lower()))",
    }  # fmt: skip


def _to_upper(row):
    return "s", {
        "swapcase": "s.swapcase()", "ord - 32": "''.join(chr(ord(c) - 32) for c in s)", "capitalize": "s.capitalize()",
        "title": "s.title()", "first only": "s[0].upper() + s[1:]", "cut": "s.upper()[:20]",
        "letters only": "''.join(c.upper() for c in s if c.isalpha())", "stripped": "s.upper().strip()",
        "lower words only": "s.upper() if s.islower() else s", "no spaces": "s.upper().replace(' ', '')", "lower": "s.lower()",
        "list": "list(s.upper())", "empty None": "s.upper() if s else None", "reversed": "s.upper()[::-1]",
    }  # fmt: skip


def _to_lower(row):
    return "s", {
        "swapcase": "s.swapcase()", "ord + 32": "''.join(chr(ord(c) + 32) for c in s)", "first only": "s[:1].lower() + s[1:]",
        "cut": "s.lower()[:20]", "letters only": "''.join(c.lower() for c in s if c.isalpha())", "stripped": "s.lower().strip()",
        "upper words only": "s.lower() if s.isupper() else s", "no spaces": "s.lower().replace(' ', '')", "upper": "s.upper()",
        "capitalize": "s.capitalize()", "empty None": "s.lower() if s else None", "title": "s.title()",
    }  # fmt: skip


def _count_char(row):
    c = row["entry_point"].rsplit("_", 1)[1]
    n = chr((ord(c) - ord("a") + 1) % 26 + ord("a"))
    return "s", {
        "contains": f"'{c}' in s", "at most 3": f"min(s.count('{c}'), 3)", "minus 1": f"s.count('{c}') - 1", "find": f"s.find('{c}')",
        "index": f"s.index('{c}')", "next letter": f"s.count('{n}')", "pieces": f"len(s.split('{c}'))", "cut": f"s[:20].count('{c}')",
        "empty None": f"s.count('{c}') if s else None", "upper": f"s.count('{c.upper()}')", "distinct": f"len(set(s) & {{'{c}'}})",
        "pairs": f"s.count('{c * 2}')", "skips first": f"sum(1 for i in range(1, len(s)) if s[i] == '{c}')",
        "skips last": f"sum(1 for i in range(len(s) - 1) if s[i] == '{c}')", "even": f"s.count('{c}') // 2 * 2",
        "float": f"float(s.count('{c}'))", "short only": f"s.count('{c}') if len(s) < 50 else 0",
        "distinct chars": f"sum(1 for ch in set(s) if ch == '{c}')",
    }  # fmt: skip


def _count_vowels(row):
    return "s", {
        "with y": "sum(ch in 'aeiouy' for ch in s)", "distinct": "len(set(s) & set('aeiou'))", "no u": "sum(ch in 'aeio' for ch in s)",
        "any": "any(ch in 'aeiou' for ch in s)", "cut": "sum(ch in 'aeiou' for ch in s[:20])", "skips last": "sum(ch in 'aeiou' for ch in s[:-1])",
        "skips first": "sum(ch in 'aeiou' for ch in s[1:])", "consonants": "sum(ch not in 'aeiou' for ch in s)",
        "at most 5": "min(sum(ch in 'aeiou' for ch in s), 5)", "first vowel": "next((i for i, ch in enumerate(s) if ch in 'aeiou'), 0)",
        "no a": "sum(ch in 'eiou' for ch in s)", "short only": "sum(ch in 'aeiou' for ch in s) if len(s) < 50 else 0",
    }  # fmt: skip


def _repeat(row):
    k = _k(row)
    m = {
        "k - 1": f"s * {k - 1}", "k + 1": f"s * {k + 1}", "spaced": f"' '.join([s] * {k})", "empty None": f"s * {k} if s else None",
        "cut": f"(s * {k})[:50]", "each char": f"''.join(ch * {k} for ch in s)", "trailing space": f"(s + ' ') * {k}",
        "list": f"[s] * {k}", "reversed copies": f"s + s[::-1] * {k - 1}", "short only": f"s * {k} if len(s) < 10 else s",
        "stripped": f"(s * {k}).strip()", "one char once": f"s * {k} if len(s) > 1 else s",
    }  # fmt: skip
    if k != 2:
        m["twice"] = "s + s"
    return "s", m


def _first_n(row):
    k = _k(row)
    m = {
        "n + 1": f"s[:{k + 1}]", "last n": f"s[-{k}:]", "after n": f"s[{k}:]", "from 1": f"s[1:{k + 1}]",
        "empty if short": f"s[:{k}] if len(s) > {k} else ''",
        "first char": f"s[0] + s[1:{k}]", "empty None": f"s[:{k}] if s else None", "drops last if short": f"s[:{k}] if len(s) > {k} else s[:-1]",
        "by index": f"''.join(s[i] for i in range({k}))", "upper": f"s[:{k}].upper()", "list": f"list(s[:{k}])",
        "first word": f"s.split()[0][:{k}]", "stripped": f"s[:{k}].strip()",
    }  # fmt: skip
    if k > 1:  # for n = 1 these two are correct
        m["n - 1"] = f"s[:{k - 1}]"
        m["empty unless long"] = f"s[:{k}] if len(s) >= {k} else ''"
    return "s", m


def _palindrome(row):
    return "s", {
        "longer than 1": "len(s) > 1 and s == s[::-1]", "non-empty": "len(s) > 0 and s == s[::-1]", "ends": "s[0] == s[-1]",
        "two ends": "s[:2] == s[-2:][::-1]", "three ends": "s[:3] == s[-3:][::-1]", "odd length": "len(s) % 2 == 1",
        "halves": "s[:len(s) // 2] == s[len(s) // 2:][::-1]", "even length": "len(s) % 2 == 0",
        "skips middle pair": "all(s[i] == s[-i - 1] for i in range(len(s) // 2 - 1))", "sorted": "s == ''.join(sorted(s))",
        "odd palindromes": "s == s[::-1] and len(s) % 2 == 1", "short only": "s == s[::-1] if len(s) < 12 else True",
        "letter set": "len(set(s)) <= len(s) // 2 + 1", "first pairs": "all(s[i] == s[-i - 1] for i in range(min(3, len(s))))",
        "int": "int(s == s[::-1])", "str": "str(s == s[::-1])", "letters only": "s == s[::-1] if s.isalpha() else False",
        "half slices": "s[:len(s) // 2] == s[-(len(s) // 2):][::-1]",
    }  # fmt: skip


def _sum_list(row):
    return "nums", {
        "no empty": "nums[0] + sum(nums[1:])", "abs": "sum(abs(v) for v in nums)", "positives": "sum(v for v in nums if v > 0)",
        "drops last": "sum(nums[:-1])", "first seven": "sum(nums[:7])", "distinct": "sum(set(nums))", "empty None": "sum(nums) if nums else None",
        "drops first": "sum(nums[1:])", "max": "max(nums, default=0)", "length": "len(nums)", "short only": "sum(nums) if len(nums) < 10 else 0",
        "reduce": "__import__('functools').reduce(lambda a, b: a + b, nums)", "float": "float(sum(nums))",
        "every other": "sum(nums[::2])", "sorted tail": "sum(sorted(nums)[1:])",
    }  # fmt: skip


def _max_of_list(row):
    return "nums", {
        "starts at 0": "max([0, *nums])", "first": "nums[0]", "last": "nums[-1]", "drops first": "max(nums[1:] or [0])",
        "drops last": "max(nums[:-1] or [0])", "abs": "max(abs(v) for v in nums)", "second": "sorted(nums)[-2]",
        "first seven": "max(nums[:7])", "min": "min(nums)", "single 0": "max(nums) if len(nums) > 1 else 0", "sum": "sum(nums)",
        "loop from 0": "m = 0\n    for v in nums:\n        if v > m:\n            m = v\n    return m",
        "every other": "max(nums[::2])", "abs key": "sorted(nums, key=abs)[-1]",
    }  # fmt: skip


def _list_length(row):
    return "items", {
        "distinct": "len(set(map(repr, items)))", "minus 1": "len(items) - 1", "plus 1": "len(items) + 1", "cut": "len(items[:10])",
        "truthy": "sum(1 for v in items if v)", "last index": "len(items) - 1 if items else 0", "str": "str(len(items))",
        "empty None": "len(items) if items else None", "distinct ints": "len(set(items)) if items and isinstance(items[0], int) else len(items)",
    }  # fmt: skip


def _last_element(row):
    return "items", {
        "first": "items[0]", "max": "max(items)", "min": "min(items)", "second last": "items[-2:][0]", "sorted last": "sorted(items)[-1]",
        "single None": "items[-1] if len(items) > 1 else None", "cut": "items[:10][-1]", "list": "items[-1:]",
        "every other": "items[::2][-1]",
    }  # fmt: skip


def _count_above(row):
    k = _k(row)
    return "nums", {
        ">=": f"sum(v >= {k} for v in nums)", "k + 1": f"sum(v > {k + 1} for v in nums)", "k - 1": f"sum(v > {k - 1} for v in nums)",
        "<": f"sum(v < {k} for v in nums)", "sums": f"sum(v for v in nums if v > {k})", "length": "len(nums)",
        "window": f"sum({k} < v <= {k + 10} for v in nums)", "first seven": f"sum(v > {k} for v in nums[:7])",
        "distinct": f"len({{v for v in nums if v > {k}}})", "empty None": f"sum(v > {k} for v in nums) if nums else None",
        "below 100": f"sum(1 for v in nums if {k} < v < 100)", "abs": f"sum(abs(v) > {k} for v in nums)",
        "any": f"any(v > {k} for v in nums)", "short only": f"sum(v > {k} for v in nums) if len(nums) < 20 else 0",
        "distinct sorted": f"sum(v > {k} for v in sorted(set(nums)))",
    }  # fmt: skip


def _scale(row):
    k = _k(row)
    return "nums", {
        "k + 1": f"[v * {k + 1} for v in nums]", "k - 1": f"[v * {k - 1} for v in nums]", "plus": f"[v + {k} for v in nums]",
        "repeated": f"nums * {k}", "tuple": f"tuple(v * {k} for v in nums)", "sorted": f"sorted(v * {k} for v in nums)",
        "abs": f"[abs(v) * {k} for v in nums]", "no zeros": f"[v * {k} for v in nums if v]", "distinct": f"list(dict.fromkeys(v * {k} for v in nums))",
        "cut": f"[v * {k} for v in nums[:10]]", "drops last": f"[v * {k} for v in nums[:-1]]", "positives": f"[v * {k} for v in nums if v > 0]",
        "sum": f"sum(nums) * {k}", "in place": f"for i in range(len(nums)):\n        nums[i] *= {k}",
        "empty None": f"[v * {k} for v in nums] if nums else None", "reversed": f"[v * {k} for v in nums][::-1]",
    }  # fmt: skip


def _keep_multiples(row):
    k = _k(row)
    return "nums", {
        "sorted": f"sorted(v for v in nums if v % {k} == 0)", "set": f"list({{v for v in nums if v % {k} == 0}})",
        "reversed": f"[v for v in nums[::-1] if v % {k} == 0]", "complement": f"[v for v in nums if v % {k}]",
        "no zero": f"[v for v in nums if v and v % {k} == 0]", "non-negative": f"[v for v in nums if v >= 0 and v % {k} == 0]",
        "positive": f"[v for v in nums if v > 0 and v % {k} == 0]", "k + 1": f"[v for v in nums if v % {k + 1} == 0]",
        "quotients": f"[v // {k} for v in nums if v % {k} == 0]", "cut": f"[v for v in nums if v % {k} == 0][:5]",
        "distinct": f"list(dict.fromkeys(v for v in nums if v % {k} == 0))", "count": f"sum(v % {k} == 0 for v in nums)",
        "tuple": f"tuple(v for v in nums if v % {k} == 0)", "drops first": f"[v for v in nums[1:] if v % {k} == 0]",
        "not k squared": f"[v for v in nums if v % {k} == 0 and v % {k * k}]", "under 100": f"[v for v in nums if v % {k} == 0 and v < 100]",
    }  # fmt: skip


_WRONG = {
    "add": _add, "mul": _mul, "multiple": _multiple, "distance": _distance, "clamp": _clamp, "digit_sum": _digit_sum,
    "factorial": _factorial, "reverse_string": _reverse, "to_upper": _to_upper, "to_lower": _to_lower,
    "count_vowels": _count_vowels, "count_char": _count_char, "repeat": _repeat, "first_n": _first_n,
    "palindrome": _palindrome, "sum_list": _sum_list, "max_of_list": _max_of_list, "list_length": _list_length,
    "last_element": _last_element, "count_above": _count_above, "scale": _scale, "keep_multiples": _keep_multiples,
}  # fmt: skip
"""Per family (or fixed function of a family: ``reverse_string``, ``sum_list``, ...) its wrong programs."""


def _key(row: dict) -> str:
    family, name = row["id"].rsplit("-", 1)[0], row["entry_point"]
    return name if name in _WRONG else family


def _source(name: str, param: str, body: str) -> str:
    lines = body.split("\n")
    if len(lines) == 1:
        return f"def {name}({param}):\n    return {body}\n"
    return f"def {name}({param}):\n    " + "\n".join(lines) + "\n"


def mutants(row: dict) -> dict[str, str]:
    """Every wrong program of ``row``'s family (the shortcuts of :func:`shortcuts` included): label -> source."""
    param, bodies = _WRONG[_key(row)](row)
    return shortcuts(row) | {label: _source(row["entry_point"], param, body) for label, body in bodies.items()}


# ----------------------------------------------------------------------------- correct programs, other idioms


def _variant_bodies(row: dict) -> tuple[str, list[str]]:
    k, key = _k(row), _key(row)
    table: dict[str, tuple[str, list[str]]] = {
        "add": ("x", [f"{k} + x", f"sum([x, {k}])", f"x - (-{k})", f"__import__('operator').add(x, {k})"]),
        "mul": ("x", [f"{k} * x", f"sum([x] * {k})", f"total = 0\n    for _ in range({k}):\n        total += x\n    return total",
                      f"total = 0\n    for _ in range(abs(x)):\n        total += {k}\n    return total if x >= 0 else -total"]),
        "multiple": ("n", [f"not n % {k}", f"abs(n) % {k} == 0", f"n // {k} * {k} == n", f"n / {k} == n // {k}",
                           f"True if n % {k} == 0 else False", f"bool(n % {k} == 0)",
                           f"n = abs(n)\n    while n >= {k}:\n        n -= {k}\n    return n == 0"]),
        "distance": ("x", [f"abs({k} - x)", f"max(x - {k}, {k} - x)", f"x - {k} if x >= {k} else {k} - x"]),
        "digit_sum": ("n", ["sum(map(int, str(n)))", "n if n < 10 else n % 10 + sum_of_digits(n // 10)",
                            "sum(int(d) for d in str(n) if d != '0')"]),
        "factorial": ("n", ["__import__('math').factorial(n)", "__import__('math').prod(range(1, n + 1))",
                            "1 if n == 0 else n * factorial(n - 1)", "__import__('functools').reduce(lambda a, b: a * b, range(1, n + 1), 1)"]),
        "reverse_string": ("s", ["''.join(reversed(s))", "out = ''\n    for c in s:\n        out = c + out\n    return out", "s[len(s)::-1]"]),
        "to_upper": ("s", ["''.join(c.upper() for c in s)", "''.join(chr(ord(c) - 32) if 'a' <= c <= 'z' else c for c in s)"]),
        "to_lower": ("s", ["s.casefold()", "''.join(chr(ord(c) + 32) if 'A' <= c <= 'Z' else c for c in s)"]),
        "count_vowels": ("s", ["sum(s.count(v) for v in 'aeiou')", "len([c for c in s if c in 'aeiou'])",
                               "sum(c in 'aeiouAEIOU' for c in s)", "len(__import__('re').findall('[aeiou]', s))"]),
        "repeat": ("s", [f"''.join([s] * {k})", f"out = ''\n    for _ in range({k}):\n        out += s\n    return out"]),
        "first_n": ("s", [f"s[0:{k}]", f"s if len(s) < {k} else s[:{k}]", f"out = ''\n    for c in s[:{k}]:\n        out += c\n    return out"]),
        "palindrome": ("s", ["s == ''.join(reversed(s))", "all(s[i] == s[-1 - i] for i in range(len(s) // 2))",
                             "list(s) == list(reversed(s))",
                             "i, j = 0, len(s) - 1\n    while i < j:\n        if s[i] != s[j]:\n            return False\n        i += 1\n        j -= 1\n    return True"]),
        "sum_list": ("nums", ["total = 0\n    for v in nums:\n        total += v\n    return total",
                              "__import__('functools').reduce(lambda a, b: a + b, nums, 0)"]),
        "max_of_list": ("nums", ["sorted(nums)[-1]", "max(set(nums))", "m = nums[0]\n    for v in nums:\n        if v > m:\n            m = v\n    return m"]),
        "list_length": ("items", ["sum(1 for _ in items)", "n = 0\n    for _ in items:\n        n += 1\n    return n"]),
        "last_element": ("items", ["items[len(items) - 1]", "list(reversed(items))[0]"]),
        "count_above": ("nums", [f"len([v for v in nums if v > {k}])", f"sum(1 for v in nums if v > {k})",
                                 f"len(list(filter(lambda v: v > {k}, nums)))"]),
        "scale": ("nums", [f"list(map(lambda v: v * {k}, nums))", f"[{k} * v for v in nums]",
                           f"out = []\n    for v in nums:\n        out.append(v * {k})\n    return out"]),
        "keep_multiples": ("nums", [f"list(filter(lambda v: v % {k} == 0, nums))", f"[v for v in nums if not v % {k}]",
                                    f"[v for v in nums if abs(v) % {k} == 0]"]),
    }  # fmt: skip
    if key == "clamp":
        lo, hi = map(int, row["entry_point"].split("_")[1:])
        return "x", [
            f"max({lo}, min(x, {hi}))",
            f"sorted([{lo}, x, {hi}])[1]",
            f"{lo} if x <= {lo} else {hi} if x >= {hi} else x",
        ]
    if key == "count_char":
        c = row["entry_point"].rsplit("_", 1)[1]
        return "s", [f"len(s.split('{c}')) - 1", f"sum(ch == '{c}' for ch in s)", f"s.lower().count('{c}')"]
    return table[key]


def variants(row: dict) -> dict[str, str]:
    """Correct programs for ``row`` written in other idioms than its reference solution: label -> source."""
    param, bodies = _variant_bodies(row)
    return {f"variant {i}": _source(row["entry_point"], param, body) for i, body in enumerate(bodies)}


def reference(row: dict) -> str:
    """The row's reference solution (source, without the fence)."""
    return spec_of(row).source


# ----------------------------------------------------------------------------- a second set, written afterwards

_LATER = {
    "add": lambda k: ("x", {"mod 10**9": f"(x + {k}) % (10**9 + 7)", "truncated": f"int(str(x + {k})[:9])",
                            "sign of x": f"x + {k} if x >= 0 else x - {k}", "round": f"round(x + {k}, -1)"}),
    "mul": lambda k: ("x", {"odd off": f"x * {k} if x % 2 == 0 else x * {k} + 1", "float scale": f"int(x * ({k} + 1e-4))",
                            "abs loop": f"sum({k} for _ in range(abs(x)))", "halves": f"x * {k} // 2 * 2"}),
    "multiple": lambda k: ("n", {"gcd wrong": f"__import__('math').gcd(n, {k}) > 1", "subtract": f"n - {k} * (n // {k}) == 0 and n >= 0",
                                 "divisors": f"{k} in [d for d in range(1, abs(n) + 1) if n % d == 0]" if k > 0 else "False",
                                 "digit sum": f"sum(map(int, str(abs(n)))) % {k} == 0"}),
    "distance": lambda k: ("x", {"abs diff of abs": f"abs(abs(x) - abs({k}))" if True else "", "half": f"abs(x - {k}) // 1 if x > 0 else {k} - x",
                                 "squared root": f"int(((x - {k}) ** 2) ** 0.5)", "k minus abs": f"{k} - x if x < {k} else abs(x) - {k}"}),
    "digit_sum": lambda k: ("n", {"str minus": "sum(int(d) for d in str(n)) - str(n).count('0')", "n - 9 * n // 10": "n - 9 * (n // 10)",
                                  "odd digits": "sum(int(d) for d in str(n)[::2])", "max digit": "max(map(int, str(n)))"}),
    "factorial": lambda k: ("n", {"stirling": "round((2 * 3.141592653589793 * n) ** 0.5 * (n / 2.718281828459045) ** n) if n else 1",
                                  "float prod": "int(__import__('math').prod(float(i) for i in range(1, n + 1)))", "n squared": "n * n if n > 2 else max(n, 1)"}),
    "reverse_string": lambda k: ("s", {"reversed words kept": "' '.join(reversed(s.split(' ')))", "title": "s[::-1].title()",
                                       "rstrip": "s.rstrip()[::-1]", "every other": "s[::-2]"}),
    "to_upper": lambda k: ("s", {"letters map": "''.join(chr(ord(c) - 32) if c.islower() else c for c in s).strip()",
                                 "upper words": "' '.join(w.upper() for w in s.split())", "isalpha": "s.upper() if s.isalpha() else s"}),
    "to_lower": lambda k: ("s", {"lower words": "' '.join(w.lower() for w in s.split())", "first lower": "s[0].lower() + s[1:].lower()",
                                 "isalpha": "s.lower() if s.isalpha() else s"}),
    "count_char": lambda c: ("s", {"regex overlap": f"len(__import__('re').findall('{c}+', s))", "counter get": f"__import__('collections').Counter(s)[{c!r}] if len(s) < 40 else s.count({c!r})",
                                   "split space": f"sum(w.count({c!r}) for w in s.split(' ')[:3])"}),
    "count_vowels": lambda k: ("s", {"regex runs": "len(__import__('re').findall('[aeiou]+', s))", "set each": "sum(1 for v in 'aeiou' if v in s)",
                                     "half": "sum(c in 'aeiou' for c in s[: len(s) // 2 + 1])"}),
    "repeat": lambda k: ("s", {"join sep": f"'-'.join([s] * {k}) if ' ' in s else s * {k}", "format": f"('{{}}' * {k}).format(*([s] * {k}))[: {k} * 8]"}),
    "first_n": lambda k: ("s", {"ljust": f"s[:{k}].ljust({k})", "rsplit": f"s[:{k}] if ' ' not in s else s.split(' ')[0][:{k}]",
                                "min len": f"s[:max(1, min({k}, len(s) - 1))]"}),
    "palindrome": lambda k: ("s", {"set symmetric": "sorted(s) == sorted(s[::-1]) and s[0] == s[-1] if s else True",
                                   "middle out": "s[len(s) // 2:] == s[:len(s) // 2 + len(s) % 2][::-1] and s[:3] == s[-3:][::-1]",
                                   "counts even": "sum(s.count(c) % 2 for c in set(s)) <= 1"}),
    "sum_list": lambda k: ("nums", {"mean times": "int(sum(nums) / len(nums) * len(nums)) if nums else 0", "positive first": "sum(sorted(nums)[len(nums) // 3:])",
                                    "no big": "sum(v for v in nums if abs(v) < 10**5)"}),
    "max_of_list": lambda k: ("nums", {"pairwise": "max(max(a, b) for a, b in zip(nums, nums[1:])) if len(nums) > 1 else nums[0] if nums[0] > 0 else 0",
                                       "last two": "max(nums[-2:])", "first five": "max(nums[:5])"}),
    "list_length": lambda k: ("items", {"index": "items.index(items[-1]) + 1 if items else 0", "count first": "items.count(items[0]) if items else 0"}),
    "last_element": lambda k: ("items", {"max index": "items[max(range(len(items)), key=lambda i: str(items[i]))]", "middle": "items[len(items) // 2]"}),
    "count_above": lambda k: ("nums", {"until below": f"len(__import__('itertools').takewhile(lambda v: True, [v for v in nums if v > {k}][:9]))",
                                       "strict range": f"sum({k} < v < {k} + 50 for v in nums)", "sorted half": f"sum(v > {k} for v in sorted(nums)[len(nums) // 2:])"}),
    "scale": lambda k: ("nums", {"dedupe adjacent": f"[v * {k} for i, v in enumerate(nums) if i == 0 or v != nums[i - 1]]",
                                 "clip": f"[max(min(v * {k}, 10**6), -10**6) for v in nums]", "shift": f"[v << {k.bit_length() - 1} for v in nums]"}),
    "keep_multiples": lambda k: ("nums", {"abs values": f"[abs(v) for v in nums if v % {k} == 0]", "first ten": f"[v for v in nums[:10] if v % {k} == 0]",
                                          "str test": f"[v for v in nums if str(v).endswith(('0', '{k}'))]"}),
}  # fmt: skip
"""Wrong programs written after the tests were fixed and measured on them (results/code/kill_rates.md, ``--later``),
to see how the tests fare on wrong programs they were not designed against. Not used to shape the tests."""


def later_mutants(row: dict) -> dict[str, str]:
    """The second set's wrong programs for ``row`` (label -> source); a correct one among them is dropped (the
    row's reference and variants decide nothing here: each is checked against the family's reference on the
    row's fresh inputs and tests before it counts)."""
    key = _key(row)
    arg = row["entry_point"].rsplit("_", 1)[1] if key == "count_char" else _k(row)
    param, bodies = _LATER[key](arg) if key in _LATER else ("x", {})
    if key == "clamp":
        lo, hi = map(int, row["entry_point"].split("_")[1:])
        param, bodies = "x", {"range in": f"x if x in range({lo}, {hi} + 1) else ({lo} if x < {lo} else {hi})",
                              "round": f"round(min(max(x, {lo}), {hi}), -1)", "mid": f"({lo} + {hi}) // 2 if abs(x) > 10**6 else min(max(x, {lo}), {hi})"}
    return {f"later: {label}": _source(row["entry_point"], param, body) for label, body in bodies.items()}


_BLIND = {
    "add": lambda k: ("x", {"abs below -k": f"x + {k} if x > -{k} else abs(x) - {k}", "zero off": f"x + {k} - (x == 0)"}),
    "mul": lambda k: ("x", {"big off": f"x * {k} if abs(x) < 5000 else x * {k} + 7", "mod": f"(x * {k}) % 10**6",
                            "negative k": f"x * {k} + (x < 0) * {k}"}),
    "multiple": lambda k: ("n", {"or k - 1": f"n % {k} == 0 or n % {k} == {k} - 1", "below a million": f"n % {k} == 0 and n < 10**6"}),
    "distance": lambda k: ("x", {"zero is zero": f"abs(x - {k}) if x != 0 else 0", "far negative": f"(x - {k}) if abs(x) > {k} else ({k} - x)"}),
    "digit_sum": lambda k: ("n", {"root or 9": "(n % 9 or 9) if n else 0", "nonzero last": "sum(int(d) for d in str(n)) - (n % 10 == 0)"}),
    "factorial": lambda k: ("n", {"64 bits": "__import__('math').factorial(n) % 2**64", "comb": "__import__('math').comb(2 * n, n)"}),
    "reverse_string": lambda k: ("s", {"words if spaced": "s[::-1] if ' ' not in s else ' '.join(reversed(s.split(' ')))"}),
    "to_upper": lambda k: ("s", {"no spaces": "''.join(c.upper() for c in s.split())"}),
    "to_lower": lambda k: ("s", {"no spaces": "''.join(c.lower() for c in s.split())"}),
    "count_char": lambda c: ("s", {"from 1": f"s.count({c!r}, 1)"}),
    "count_vowels": lambda k: ("s", {"end vowels": "len(s) - len(s.strip('aeiou'))"}),
    "repeat": lambda k: ("s", {"letters only": f"s * {k} if s.isalpha() else s"}),
    "first_n": lambda k: ("s", {"letters only": f"s[:{k}] if s.isalpha() or not s else s", "lstrip": f"s[:{k}].lstrip()"}),
    "palindrome": lambda k: ("s", {"or two": "s[::-1] == s or len(s) == 2"}),
    "sum_list": lambda k: ("nums", {"abs if small": "sum(abs(v) for v in nums) if min(nums, default=0) > -50 else sum(nums)"}),
    "max_of_list": lambda k: ("nums", {"three places": "max(nums[0], nums[-1], nums[len(nums) // 2])"}),
    "list_length": lambda k: ("items", {"at most 50": "min(len(items), 50)"}),
    "last_element": lambda k: ("items", {"even length": "items[-1] if len(items) % 2 else items[-2]"}),
    "count_above": lambda k: ("nums", {"not k + 1": f"sum(v > {k} for v in nums if v != {k} + 1)"}),
    "scale": lambda k: ("nums", {"not one": f"[v * {k} for v in nums if v != 1]", "above -100": f"[v * {k} for v in nums if v > -100]"}),
    "keep_multiples": lambda k: ("nums", {"above -100": f"[v for v in nums if v % {k} == 0 and v > -100]"}),
}  # fmt: skip
"""A third set, written after the tests and measured at 12 tests (results/code/kill_rates.md, ``--set blind``): it
found gaps (remainder k - 1, lists longer than 50, a 1 in a list, multiples below -100, non-letters in count and
first_n inputs, multiples past 10**6) that the edge classes then closed; so it is no longer blind (``--set last``)."""


def blind_mutants(row: dict) -> dict[str, str]:
    """The third set's wrong programs for ``row`` (label -> source); as :func:`later_mutants`."""
    key = _key(row)
    arg = row["entry_point"].rsplit("_", 1)[1] if key == "count_char" else _k(row)
    param, bodies = _BLIND[key](arg) if key in _BLIND else ("x", {})
    if key == "clamp":
        lo, hi = map(int, row["entry_point"].split("_")[1:])
        param, bodies = "x", {"negatives": f"min(max(x, {lo}), {hi}) if x >= 0 else {lo} - 1",
                              "hi is lo": f"x if {lo} <= x < {hi} else {hi} if x > {hi} else {lo}"}
    return {f"blind: {label}": _source(row["entry_point"], param, body) for label, body in bodies.items()}


_LAST = {
    "add": lambda k: ("x", {"loop": f"y = x\n    for _ in range({k}):\n        y += 1 if y < 10**8 else 0\n    return y",
                            "divmod": f"sum(divmod(x + {k}, 1)) if x >= 0 else x + {k} + 1"}),
    "mul": lambda k: ("x", {"loop to x": f"t = 0\n    for _ in range(min(abs(x), 10**5)):\n        t += {k}\n    return t if x >= 0 else -t"}),
    "multiple": lambda k: ("n", {"float": f"(n / {k}).is_integer() if abs(n) < 10**5 else n % {k} == 0 and n % 2 == 0",
                                 "str rule": f"str(n)[-1] in '0{k % 10}' if n >= 0 else n % {k} == 0"}),
    "distance": lambda k: ("x", {"loop": f"d = 0\n    y = x\n    while y != {k} and d < 10**4:\n        y += 1 if y < {k} else -1\n        d += 1\n    return d"}),
    "digit_sum": lambda k: ("n", {"first five": "sum(int(d) for d in str(n)[-5:])", "nines": "sum(int(d) for d in str(n) if d != '9')"}),
    "factorial": lambda k: ("n", {"range to n": "__import__('math').prod(range(2, n)) * max(n, 1)"}),
    "reverse_string": lambda k: ("s", {"deque": "''.join(__import__('collections').deque(s, maxlen=100))[::-1]"}),
    "to_upper": lambda k: ("s", {"ascii map": "''.join(chr(ord(c) & ~32) if c.isalpha() else c for c in s) if s.isascii() else s"}),
    "to_lower": lambda k: ("s", {"or 32": "''.join(chr(ord(c) | 32) if c.isalnum() else c for c in s)"}),
    "count_char": lambda c: ("s", {"words": f"sum(1 for w in s.split() if {c!r} in w)"}),
    "count_vowels": lambda k: ("s", {"words": "sum(1 for w in s.split() for c in set(w) if c in 'aeiou')"}),
    "repeat": lambda k: ("s", {"rjust": f"(s * {k}).rjust({k} * len(s.strip()))"}),
    "first_n": lambda k: ("s", {"partition": f"s.partition(' ')[0][:{k}] if s.strip() else s[:{k}]"}),
    "palindrome": lambda k: ("s", {"quarter": "s[: len(s) // 4 + 1] == s[::-1][: len(s) // 4 + 1]"}),
    "sum_list": lambda k: ("nums", {"pairs": "sum(a + b for a, b in zip(nums[::2], nums[1::2])) + (nums[-1] if len(nums) % 2 else 0)"}),
    "max_of_list": lambda k: ("nums", {"bubble once": "a = list(nums)\n    for i in range(min(len(a) - 1, 10)):\n        if a[i] > a[i + 1]:\n            a[i], a[i + 1] = a[i + 1], a[i]\n    return a[-1]"}),
    "list_length": lambda k: ("items", {"last index": "max((i for i, _ in enumerate(items)), default=-1) + 1 if len(items) < 100 else 99"}),
    "last_element": lambda k: ("items", {"pop": "list(items).pop(-1) if len(items) != 2 else items[0]"}),
    "count_above": lambda k: ("nums", {"bisect": f"len(nums) - __import__('bisect').bisect_right(nums, {k})"}),
    "scale": lambda k: ("nums", {"enumerate": f"[v * {k} for i, v in enumerate(nums) if i < 30]"}),
    "keep_multiples": lambda k: ("nums", {"abs filter": f"[v for v in nums if abs(v) % {k} == 0 and abs(v) < 10**4]"}),
}  # fmt: skip
"""A fourth set, written after the tests' last change and measured once, as it came (results/code/kill_rates.md,
``--set last``): the tests were not changed after it."""


def last_mutants(row: dict) -> dict[str, str]:
    """The fourth set's wrong programs for ``row`` (label -> source); as :func:`later_mutants`."""
    key = _key(row)
    arg = row["entry_point"].rsplit("_", 1)[1] if key == "count_char" else _k(row)
    param, bodies = _LAST[key](arg) if key in _LAST else ("x", {})
    if key == "clamp":
        lo, hi = map(int, row["entry_point"].split("_")[1:])
        param, bodies = "x", {"sorted three": f"sorted([{lo}, x, {hi}])[1] if x != {hi} - 1 else {hi}",
                              "loop": f"y = x\n    while y < {lo} and y > -10**5:\n        y += 1\n    return min(y, {hi})"}
    return {f"last: {label}": _source(row["entry_point"], param, body) for label, body in bodies.items()}
