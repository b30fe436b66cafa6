"""The procedural code task (graft/data/code_task.py): deterministic rows, hidden tests of one form on inputs other
than the example's, reference solutions that pass them, one specification per function name."""
from __future__ import annotations

import ast
import hashlib
import json
import random
import re

import pytest

from graft.data.code_task import CODE_FAMILIES, DEFAULT_FAMILIES, make_code_task, solution, spec_of
from graft.reward.code import code_reference
from graft.reward.sandbox import _same, parse_tests

TEST_RE = re.compile(r"assert (\w+)\((.*)\) == (.+)")
EXAMPLE_RE = re.compile(r"For example, (\w+\(.*\)) returns (.+)\.$")


def run_reference(row: dict) -> dict:
    """Execute the row's reference solution (trusted code of the module, so a plain exec) and return its namespace."""
    code = solution(row)
    assert code.startswith("```python\n") and code.endswith("```")
    namespace: dict = {}
    exec(code.removeprefix("```python\n").removesuffix("```"), namespace)
    return namespace


def test_known_rows_are_stable_across_runs_and_platforms():
    rows = make_code_task(3, 0, ["add", "transform", "palindrome"])
    assert rows[0] == {
        "id": "add-00000",
        # 97 + 50 = 147 in the example; the tests: 53 + 50 = 103, 5 + 50 = 55, 33 + 50 = 83, 65 + 50 = 115
        "problem": "Write a Python function `add_50(x)` that returns x plus 50. For example, add_50(97) returns 147.",
        "tests": ["assert add_50(53) == 103", "assert add_50(5) == 55", "assert add_50(33) == 83",
                  "assert add_50(65) == 115"],
        "entry_point": "add_50"}
    assert rows[1]["problem"] == ("Write a Python function `to_upper(s)` that returns the string s with every letter "
                                  "in upper case. For example, to_upper('clock') returns 'CLOCK'.")
    # the palindrome tests alternate: 'nktug' reversed is 'gutkn' (False), 'oqibbiqo' reversed is itself (True)
    assert rows[2]["tests"][:2] == ["assert is_palindrome('nktug') == False", "assert is_palindrome('oqibbiqo') == True"]
    # pinned: random.Random(seed) integer draws are stable across Python versions and platforms
    digest = hashlib.sha256(json.dumps(make_code_task(512, 1234), sort_keys=True).encode()).hexdigest()
    # re-pinned by the test-gap audit (test_no_shortcut_or_near_miss_passes; before it 96f8d99a0fd3...f078f, since the
    # multiple family's n < k test): the tests of 11 families changed, the problems of rows 0..182 did not (fixes
    # reshape drawn values without new draws; a changed duplicate retry moves the rng stream from row 183 on)
    assert digest == "dd48167df5cc2b63c8d294eb684ab4316a71d767f0f83060c9d4acee97b442f6"


def test_deterministic_in_the_seed():
    a = make_code_task(64, 7)
    assert make_code_task(64, 7) == a
    b = make_code_task(64, 8)
    assert b != a and sum(x["problem"] != y["problem"] for x, y in zip(a, b)) > 32
    assert make_code_task(64, 7, tests_per_prompt=2)[0]["problem"] == a[0]["problem"]  # fewer tests, same problem


def test_ids_families_and_row_shape():
    families = ["clamp", "add", "add", "palindrome"]  # add named twice: twice the share
    rows = make_code_task(40, 3, families, tests_per_prompt=5)
    assert [r["id"] for r in rows[:5]] == ["clamp-00000", "add-00001", "add-00002", "palindrome-00003", "clamp-00004"]
    assert len({r["id"] for r in rows}) == 40 and len({r["problem"] for r in rows}) == 40
    for r in rows:
        assert set(r) == {"id", "problem", "tests", "entry_point"} and len(r["tests"]) == 5
        assert r["problem"].startswith(f"Write a Python function `{r['entry_point']}(")
        assert r["problem"].count("For example") == 1
    assert len(make_code_task(10, 0, tests_per_prompt=9, families=["factorial"])) == 10   # 1 example + 9 tests of 0..10
    rows = make_code_task(6_000, 5)   # the default mix holds thousands of distinct problems
    assert len({r["problem"] for r in rows}) == 6_000


@pytest.mark.parametrize("family", list(CODE_FAMILIES))
def test_reference_passes_its_tests_and_the_example_is_not_a_test(family):
    rows = make_code_task(11 if family == "factorial" else 40, 11, [family], tests_per_prompt=4)
    for row in rows:
        ns = run_reference(row)
        calls = []
        for test in row["tests"]:
            name, args, expected = TEST_RE.fullmatch(test).groups()
            assert name == row["entry_point"]
            call = ast.parse(test).body[0].test.left
            [ast.literal_eval(a) for a in call.args]   # raises unless every argument is a literal
            assert repr(ast.literal_eval(expected)) == expected
            exec(test, ns)                              # raises AssertionError when the reference disagrees
            calls.append(f"{name}({args})")
        example_call, example_value = EXAMPLE_RE.search(row["problem"]).groups()
        assert eval(example_call, ns) == ast.literal_eval(example_value)   # the problem's example is right
        assert example_call not in calls and len(set(calls)) == len(calls)  # tests on other, distinct inputs


def test_constant_answers_cannot_pass_boolean_and_piecewise_families():
    for row in make_code_task(60, 2, ["multiple", "palindrome", "clamp", "distance"], tests_per_prompt=4):
        values = [t.rsplit(" == ", 1)[1] for t in row["tests"]]
        assert len(set(values)) > 1, row   # True and False both tested; clamp: below, above, inside


def test_one_specification_per_function_name():
    seen: dict[str, str] = {}
    for family, fam in CODE_FAMILIES.items():
        specs = [fam.build(*c) for c in fam.space]
        assert len({s.name for s in specs}) == len(specs), family   # names never collide within a family
        for s in specs:
            assert seen.setdefault(s.name, family) == family      # nor across families
        assert fam.doc and "\n" not in fam.doc                    # one-line description
    assert set(DEFAULT_FAMILIES) == set(CODE_FAMILIES) - {"factorial"}
    row = make_code_task(1, 0, ["clamp"])[0]
    spec = spec_of(row)
    # clamp_lo_hi: the name carries both constants; x < lo -> lo, x > hi -> hi
    lo, hi = map(int, row["entry_point"].split("_")[1:])
    assert (spec.ref(lo - 1), spec.ref(hi + 1), spec.ref(lo)) == (lo, hi, lo)


def test_hand_worked_references():
    def ref(family, *constants):
        return CODE_FAMILIES[family].build(*constants).ref
    assert ref("add", 3)(2) == 5                                   # 2 + 3
    assert ref("mul", 4)(6) == 24                                  # 6 * 4
    assert ref("multiple", 3)(12) is True and ref("multiple", 3)(13) is False   # 12 = 3 * 4; 13 = 3 * 4 + 1
    assert ref("distance", 10)(4) == 6 and ref("distance", 10)(15) == 5        # |4 - 10|, |15 - 10|
    assert [ref("clamp", 3, 20)(x) for x in (-5, 7, 25)] == [3, 7, 20]
    assert ref("digit_sum")(4096) == 19                            # 4 + 0 + 9 + 6
    assert ref("factorial")(5) == 120 and ref("factorial")(0) == 1  # 1 * 2 * 3 * 4 * 5
    assert ref("transform", "reverse_string")("abc") == "cba"
    assert ref("count_char", "e")("tree") == 2 and ref("count_char", "vowels")("banana") == 3
    assert ref("repeat", 3)("ab") == "ababab"
    assert ref("first_n", 3)("python") == "pyt" and ref("first_n", 3)("py") == "py"
    assert ref("palindrome")("level") is True and ref("palindrome")("lever") is False
    assert ref("list_stat", "max_of_list")([3, 9, 2]) == 9 and ref("list_stat", "last_element")([3, 9, 2]) == 2
    assert ref("count_above", 0)([-1, 0, 2, 5]) == 2              # 2 and 5 are positive
    assert ref("scale", 2)([1, -3]) == [2, -6]
    assert ref("keep_multiples", 2)([1, 2, 3, 4]) == [2, 4]


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(ValueError, match="unknown code families \\['nope'\\]; valid: add, mul"):
        make_code_task(4, 0, ["add", "nope"])
    with pytest.raises(ValueError, match="unknown code families"):
        make_code_task(4, 0, [])
    with pytest.raises(ValueError, match="num_prompts must be positive"):
        make_code_task(0, 0)
    with pytest.raises(ValueError, match="tests_per_prompt must be positive"):
        make_code_task(4, 0, tests_per_prompt=0)
    with pytest.raises(ValueError, match="too few distinct problems") as e:
        make_code_task(12, 0, ["factorial"])   # n in 0..10: 11 problems
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="too few distinct inputs"):
        make_code_task(1, 0, ["factorial"], tests_per_prompt=11)   # 11 inputs, one is the example
    with pytest.raises(ValueError, match="not a row of the procedural code task"):
        solution({"id": "add-00000", "entry_point": "mul_3", "problem": "", "tests": []})


def test_every_multiple_problem_tries_a_positive_n_below_the_divisor():
    # seen rewarded in the code run: `return (n % 9 == 0) or (n // 9 == 0)` is True for n = 1..8, and the four tests
    # (412, 342, 49, 288) never tried such an n; the first test is now one (e.g. is_multiple_of_9(4) == False)
    rows = [r for r in make_code_task(400, 1234) if r["id"].startswith("multiple")]
    assert len(rows) > 20
    for r in rows:
        k = int(r["entry_point"].rsplit("_", 1)[1])
        n = int(r["tests"][0].split("(")[1].split(")")[0])
        assert 0 < n < k and r["tests"][0].endswith("== False"), r["tests"]
        ns = {}
        exec(f"def {r['entry_point']}(n):\n    return (n % {k} == 0) or (n // {k} == 0)\n", ns)
        with pytest.raises(AssertionError):
            for t in r["tests"]:
                exec(t, ns)


# ----------------------------------------------------------------------------- test gaps: shortcuts and near misses


def passes_all_tests(program: str, row: dict) -> bool:
    """Whether ``program`` earns the reward on ``row``, graded as graft.reward.code.verify_code grades it (without the
    sandbox: our own trusted programs, so a plain exec): the row's reference JSON (code_reference) parsed into split
    tests (parse_tests: CALL and expected literal), each call's value sent through repr and ast.literal_eval (what
    crosses the sandbox) and compared with sandbox._same (so 1 passes for True, a tuple fails for a list)."""
    ref = json.loads(code_reference(row))
    namespace: dict = {}
    exec(program, namespace)
    for case in parse_tests(ref["tests"], ref["entry_point"]):
        try:
            value = ast.literal_eval(repr(eval(case.call, namespace)))
        except Exception:   # raised, or no literal (a map object): that test fails
            return False
        if not _same(case.expected, value):
            return False
    return True


def shortcuts(row: dict) -> dict[str, str]:
    """Programs that ignore the input: a constant (None, True, False, 0, 1, '', [], the example's own value) or the
    first argument itself."""
    name = row["entry_point"]
    example_value = EXAMPLE_RE.search(row["problem"]).group(2)
    constants = ["None", "True", "False", "0", "1", "''", "[]", "args[0]", example_value]
    return {f"returns {c}": f"def {name}(*args):\n    return {c}\n" for c in constants}


def _next(c: str) -> str:
    return chr((ord(c) - ord("a") + 1) % 26 + ord("a"))


def near_misses(row: dict) -> dict[str, str]:
    """Plausible wrong programs of the row's family (label -> source), one return expression each. Every one is
    wrong for some valid input (hand-checked, e.g. `x + 8` for add_7 at any x); the audit asks that each fails at
    least one of the row's tests."""
    family, name = row["id"].rsplit("-", 1)[0], row["entry_point"]
    tail = name.rsplit("_", 1)[-1]
    k = int(tail) if tail.isdigit() else 0
    if family == "add":
        param, m = "x", {"k + 1": f"x + {k + 1}", "k - 1": f"x + {k - 1}", "minus": f"x - {k}", "times": f"x * {k}"}
    elif family == "mul":
        param, m = "x", {"k + 1": f"x * {k + 1}", "k - 1": f"x * {k - 1}", "plus": f"x + {k}", "power": f"x ** {k}"}
    elif family == "multiple":
        # `n % k == 0 and n > 0` passed 97% of rows before test 2 became n = 0; `n % 2 == 0` for is_multiple_of_8
        # passed 16% (the False tests happened to be odd): the False tests are now 4 and 8m + 4
        param, m = "n", {"k + 1": f"n % {k + 1} == 0", "negated": f"n % {k} != 0", "zero is not": f"n % {k} == 0 and n > 0",
                         "below k": f"n % {k} == 0 or n // {k} == 0"}
        if k > 2:
            m["k - 1"] = f"n % {k - 1} == 0"
        m.update({f"divisor {d}": f"n % {d} == 0" for d in range(2, k) if k % d == 0})
    elif family == "distance":
        param, m = "x", {"x - k": f"x - {k}", "k - x": f"{k} - x", "abs(x) - k": f"abs(x) - {k}", "k + 1": f"abs(x - {k + 1})",
                         "k - 1": f"abs(x - {k - 1})", "squared": f"(x - {k}) ** 2"}
    elif family == "clamp":
        lo, hi = map(int, name.split("_")[1:])
        param, m = "x", {"hi - 1": f"min(max(x, {lo}), {hi - 1})", "hi + 1": f"min(max(x, {lo}), {hi + 1})",
                         "lo + 1": f"min(max(x, {lo + 1}), {hi})", "lo - 1": f"min(max(x, {lo - 1}), {hi})",
                         "swapped": f"max(min(x, {lo}), {hi})", "lo outside": f"x if {lo} <= x <= {hi} else {lo}",
                         "no upper": f"max(x, {lo})", "no lower": f"min(x, {hi})"}
    elif family == "digit_sum":
        # the digital root and n % 9 agree with the digit sum while it is below 10 (1.3% of rows passed); test 1 is
        # now n * 1000 + 789: sum_of_digits(5789) == 29, digital root 2, 5789 % 9 == 2, 9 + 578 == 587
        param, m = "n", {"mod 9": "n % 9", "digital root": "0 if n == 0 else 1 + (n - 1) % 9", "two digits": "n % 10 + n // 10",
                         "last two": "n % 10 + n // 10 % 10", "length": "len(str(n))", "last digit": "n % 10"}
    elif family == "factorial":
        # the recursion with only n == 1 as base case raises RecursionError at 0: it passed 64% of rows (0 untested)
        param, m = "n", {"(n - 1)!": "__import__('math').prod(range(1, n))", "n": "n",
                         "(n + 1)!": "__import__('math').prod(range(1, n + 2))"}
        if "factorial(0) returns" not in row["problem"]:   # 0 is then the first test; else the example shows it
            m["no base case 0"] = "1 if n == 1 else n * factorial(n - 1)"
    elif name == "reverse_string":
        param, m = "s", {"drops first": "s[-1:0:-1]", "rotated": "s[1:] + s[:1]", "sorted": "''.join(sorted(s, reverse=True))"}
    elif name == "to_upper":
        # on lowercase words only (95% of to_upper rows) both passed; test 1 is capitalised: 'Clock'.swapcase() is 'cLOCK'
        param, m = "s", {"swapcase": "s.swapcase()", "ord - 32": "''.join(chr(ord(c) - 32) for c in s)",
                         "capitalize": "s.capitalize()"}
    elif name == "to_lower":
        param, m = "s", {"swapcase": "s.swapcase()", "ord + 32": "''.join(chr(ord(c) + 32) for c in s)",
                         "first only": "s[:1].lower() + s[1:]"}
    elif name == "count_vowels":
        # counting y, distinct vowels, or a, e, i, o alone each passed over half of these rows; test 1 ends in 'uyu'
        param, m = "s", {"with y": "sum(ch in 'aeiouy' for ch in s)", "distinct": "len(set(s) & set('aeiou'))",
                         "no u": "sum(ch in 'aeio' for ch in s)", "any": "any(ch in 'aeiou' for ch in s)"}
    elif family == "count_char":
        # `c in s` is True == 1 where c occurs once (6% of rows passed); test 2 now holds c twice. Case is not tested:
        # the problem says "the letter 'c'" without a case and every input is lowercase, so s.lower().count(c) is
        # a reading of the text, not a near miss (an upper-case test would need the problem text to say more)
        param, m = "s", {"contains": f"'{tail}' in s", "minus 1": f"s.count('{tail}') - 1", "find": f"s.find('{tail}')",
                         "next letter": f"s.count('{_next(tail)}')"}
    elif family == "repeat":
        param, m = "s", {"k - 1": f"s * {k - 1}", "k + 1": f"s * {k + 1}", "spaced": f"' '.join([s] * {k})"}
    elif family == "first_n":
        param, m = "s", {"n + 1": f"s[:{k + 1}]", "last n": f"s[-{k}:]", "after n": f"s[{k}:]", "from 1": f"s[1:{k + 1}]",
                         "empty if short": f"s[:{k}] if len(s) > {k} else ''"}
        if k > 1:
            m["n - 1"] = f"s[:{k - 1}]"
    elif family == "palindrome":
        # s[0] == s[-1] passed 94% of rows, s[:2] == s[-2:][::-1] all of them: no False test had matching ends
        param, m = "s", {"ends": "s[0] == s[-1]", "two ends": "s[:2] == s[-2:][::-1]", "odd length": "len(s) % 2 == 1",
                         "halves": "s[:len(s) // 2] == s[len(s) // 2:][::-1]", "even length": "len(s) % 2 == 0",
                         "skips middle pair": "all(s[i] == s[-i - 1] for i in range(len(s) // 2 - 1))",
                         "sorted": "s == ''.join(sorted(s))"}
    elif name == "sum_list":
        param, m = "nums", {"no empty": "nums[0] + sum(nums[1:])", "abs": "sum(abs(v) for v in nums)",
                            "positives": "sum(v for v in nums if v > 0)", "drops last": "sum(nums[:-1])"}
    elif name == "max_of_list":
        # starting from m = 0 passed 25% of list_stat rows (all of max_of_list but an all-negative list)
        param, m = "nums", {"starts at 0": "max([0, *nums])", "first": "nums[0]", "last": "nums[-1]",
                            "drops first": "max(nums[1:] or nums)", "drops last": "max(nums[:-1] or nums)",
                            "abs": "max(abs(v) for v in nums)"}
    elif name == "list_length":
        param, m = "items", {"distinct": "len(set(items))", "minus 1": "len(items) - 1"}
    elif name == "last_element":
        param, m = "items", {"first": "items[0]", "max": "max(items)", "min": "min(items)", "second last": "items[-2:][0]"}
    elif family == "count_above":
        # `v >= k` passed 44% of rows (k itself in no test); test 1 is now [k + 1, ..., k]
        param, m = "nums", {">=": f"sum(v >= {k} for v in nums)", "k + 1": f"sum(v > {k + 1} for v in nums)",
                            "k - 1": f"sum(v > {k - 1} for v in nums)", "<": f"sum(v < {k} for v in nums)",
                            "sums": f"sum(v for v in nums if v > {k})", "length": "len(nums)"}
    elif family == "scale":
        param, m = "nums", {"k + 1": f"[v * {k + 1} for v in nums]", "k - 1": f"[v * {k - 1} for v in nums]",
                            "plus": f"[v + {k} for v in nums]", "repeated": f"nums * {k}",
                            "tuple": f"tuple(v * {k} for v in nums)",
                            "sorted": f"sorted(v * {k} for v in nums)", "abs": f"[abs(v) * {k} for v in nums]"}
    elif family == "keep_multiples":
        # sorted passed 45% of rows (one multiple, or already in order), `v and v % k == 0` 70% (0 never tested)
        param, m = "nums", {"sorted": f"sorted(v for v in nums if v % {k} == 0)",
                            "set": f"list({{v for v in nums if v % {k} == 0}})",
                            "reversed": f"[v for v in nums[::-1] if v % {k} == 0]", "complement": f"[v for v in nums if v % {k}]",
                            "no zero": f"[v for v in nums if v and v % {k} == 0]",
                            "k + 1": f"[v for v in nums if v % {k + 1} == 0]",
                            "quotients": f"[v // {k} for v in nums if v % {k} == 0]"}
    else:
        raise AssertionError(f"no near misses written for family {family!r}: add them")
    return {label: f"def {name}({param}):\n    return {body}\n" for label, body in m.items()}


@pytest.mark.parametrize("family", list(CODE_FAMILIES))
def test_no_shortcut_or_near_miss_passes(family):
    # every family, two seeds, the default 4 tests: the reference passes every test, and each shortcut (a constant,
    # the input itself) and each of the family's near misses fails at least one (the guarantees need >= 4 tests)
    rows = [row for seed in (0, 1) for row in make_code_task(11 if family == "factorial" else 40, seed, [family])]
    for row in rows:
        assert passes_all_tests(solution(row).removeprefix("```python\n").removesuffix("```"), row), row
        for label, program in {**shortcuts(row), **near_misses(row)}.items():
            assert not passes_all_tests(program, row), (label, program, row["tests"])


def test_near_miss_tests_hand_worked():
    # the fixed draws on one row each, by hand
    rows = make_code_task(3, 0, ["add", "transform", "palindrome"])
    # 'mwzvuatp' + 'q' + 'tauvzwm': the ends and every pair match but the middle one (p / q), so False; test 4 is odd
    assert rows[2]["tests"][2:] == ["assert is_palindrome('mwzvuatpqtauvzwm') == False",
                                    "assert is_palindrome('hxkkkxh') == True"]
    multiple = CODE_FAMILIES["multiple"].build(12)
    rng = random.Random(0)
    n = [multiple.draw(rng, j)[0] for j in range(1, 5)]
    # 12 = 2 * 2 * 3: False tests 12 // 3 = 4 and 12m + 12 // 2 = 12m + 6 (2, 4 divide the first; 3, 6 the second)
    assert n[0] == 4 and n[1] == 0 and n[2] % 12 == 6 and n[3] % 12 == 0 and n[3] // 12 % 11 and n[3] // 12 % 13
    count_above = CODE_FAMILIES["count_above"].build(5)
    first = count_above.draw(rng, 1)[0]
    assert first[0] == 6 and first[-1] == 5   # [6, ..., 5]: `v >= 5` counts the 5, `v > 6` misses the 6
    assert count_above.ref(count_above.draw(rng, 2)[0]) == 0
    stat = {name: CODE_FAMILIES["list_stat"].build(name) for name in ("sum_list", "max_of_list", "last_element")}
    assert stat["sum_list"].draw(rng, 1) == ([],) and max(stat["sum_list"].draw(rng, 2)[0]) < 0
    negatives = stat["max_of_list"].draw(rng, 1)[0]
    assert negatives[-1] == -1 and max(negatives[:-1]) < -1   # the maximum -1, last: `m = 0` returns 0
    last = stat["last_element"].draw(rng, 1)[0]   # [a - 1, ..., a + 1, a]
    assert last[-1] == last[0] + 1 == last[-2] - 1
