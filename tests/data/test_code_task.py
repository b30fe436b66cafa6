"""The procedural code task (graft/data/code_task.py): deterministic rows, hidden tests of one form on inputs other
than the example's, reference solutions that pass them, one specification per function name."""
from __future__ import annotations

import ast
import hashlib
import json
import re

import pytest

from graft.data.code_task import CODE_FAMILIES, DEFAULT_FAMILIES, make_code_task, solution, spec_of

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
    assert digest == "96f8d99a0fd384124dfe616c9885db36a4e1392a0bc6840b1bab80512b8f078f"   # since the multiple family's n < k test


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
