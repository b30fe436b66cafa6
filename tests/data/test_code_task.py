"""The procedural code task (graft/data/code_task.py): deterministic rows, hidden tests of one form on inputs other
than the example's covering each family's edge classes, held-out tests on fresh inputs, reference solutions that pass
them, one specification per function name, and a mutant suite (tests/data/code_mutants.py) the tests reject."""
from __future__ import annotations

import ast
import hashlib
import json
import random
import re

import pytest

from graft.data.code_task import CODE_FAMILIES, DEFAULT_FAMILIES, TESTS_PER_PROMPT, make_code_task, solution, spec_of
from graft.reward.code import code_reference
from tests.data.code_mutants import mutants, reference, rewarded, variants

TEST_RE = re.compile(r"assert (\w+)\((.*)\) == (.+)")
EXAMPLE_RE = re.compile(r"For example, (\w+\(.*\)) returns (.+)\.$")


def run_reference(row: dict) -> dict:
    """Execute the row's reference solution (trusted code of the module, so a plain exec) and return its namespace."""
    code = solution(row)
    assert code.startswith("```python\n") and code.endswith("```")
    namespace: dict = {}
    exec(code.removeprefix("```python\n").removesuffix("```"), namespace)
    return namespace


def inputs(row: dict, key: str = "tests") -> list[tuple]:
    """The argument tuples of a row's tests."""
    return [tuple(ast.literal_eval(a) for a in ast.parse(t).body[0].test.left.args) for t in row[key]]


def test_known_rows_are_stable_across_runs_and_platforms():
    rows = make_code_task(3, 0, ["add", "transform", "palindrome"])
    assert rows[0]["problem"] == ("Write a Python function `add_50(x)` that returns x plus 50. For example, add_50(98) "
                                  "returns 148.")
    # the edge classes of add first: 0 + 50, -50 + 50 (= 0), -1 + 50 (the negative above -100 drew -50 again and
    # was skipped), then sizes past 10**8 of both signs
    assert rows[0]["tests"][:5] == ["assert add_50(0) == 50", "assert add_50(-50) == 0", "assert add_50(-1) == 49",
                                    "assert add_50(913847339) == 913847389", "assert add_50(-548414699) == -548414649"]
    # '' and one letter are palindromes; 'hi' is not; 'dxmnmxd' is odd, 'hforesth' has equal ends around 'forest'
    assert rows[2]["tests"][:4] == ["assert is_palindrome('') == True", "assert is_palindrome('h') == True",
                                    "assert is_palindrome('hh') == True", "assert is_palindrome('hi') == False"]
    assert rows[2]["tests"][5:8] == ["assert is_palindrome('dxmnmxd') == True", "assert is_palindrome('forestuserof') == False",
                                     "assert is_palindrome('hforesth') == False"]
    # pinned: random.Random(seed) integer draws are stable across Python versions and platforms
    digest = hashlib.sha256(json.dumps(make_code_task(512, 1234), sort_keys=True).encode()).hexdigest()
    # re-pinned when every family's tests became its edge classes plus random inputs, with fresh tests (before:
    # dd48167df5cc...442f6, four tests per problem)
    assert digest == "05d3266c8e7c9805b995375af3ad969a7d56091a9e87fdaab289136f7cae3526"


def test_deterministic_in_the_seed():
    a = make_code_task(64, 7)
    assert make_code_task(64, 7) == a
    b = make_code_task(64, 8)
    assert b != a and sum(x["problem"] != y["problem"] for x, y in zip(a, b)) > 32
    fewer = make_code_task(64, 7, tests_per_prompt=2, fresh_tests=0)
    assert [r["problem"] for r in fewer] == [r["problem"] for r in a]   # fewer tests, same problems
    assert [r["tests"] for r in fewer] == [r["tests"][:2] for r in a]   # the first tests are the edge classes
    assert all("fresh_tests" not in r for r in fewer)
    other = make_code_task(64, 7, fresh_tests=3)                        # the fresh tests have a stream of their own
    assert [r["tests"] for r in other] == [r["tests"] for r in a]
    assert all(len(r["fresh_tests"]) == 3 and not set(r["fresh_tests"]) & set(r["tests"]) for r in other)


def test_ids_families_and_row_shape():
    families = ["clamp", "add", "add", "palindrome"]  # add named twice: twice the share
    rows = make_code_task(40, 3, families, tests_per_prompt=5, fresh_tests=4)
    assert [r["id"] for r in rows[:5]] == ["clamp-00000", "add-00001", "add-00002", "palindrome-00003", "clamp-00004"]
    assert len({r["id"] for r in rows}) == 40 and len({r["problem"] for r in rows}) == 40
    for r in rows:
        assert set(r) == {"id", "problem", "tests", "entry_point", "fresh_tests"}
        assert len(r["tests"]) == 5 and len(r["fresh_tests"]) == 4
        assert r["problem"].startswith(f"Write a Python function `{r['entry_point']}(")
        assert r["problem"].count("For example") == 1
    assert len(make_code_task(8, 0, families=["factorial"])) == 8   # examples 3..10
    rows = make_code_task(6_000, 5)   # the default mix holds thousands of distinct problems
    assert len({r["problem"] for r in rows}) == 6_000
    assert all(len(r["tests"]) == TESTS_PER_PROMPT for r in rows)


@pytest.mark.parametrize("family", list(CODE_FAMILIES))
def test_reference_passes_its_tests_and_the_example_is_not_a_test(family):
    rows = make_code_task(8 if family == "factorial" else 40, 11, [family])
    for row in rows:
        ns = run_reference(row)
        calls = []
        for test in row["tests"] + row["fresh_tests"]:
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
        assert json.loads(code_reference(row))["holdout"] == row["fresh_tests"]   # held out of the reward


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
    assert ref("add", 3)(2) == 5 and ref("add", 3)(-3) == 0        # 2 + 3, -3 + 3
    assert ref("mul", 4)(6) == 24 and ref("mul", 4)(-2) == -8      # 6 * 4, -2 * 4
    assert ref("multiple", 3)(12) is True and ref("multiple", 3)(13) is False   # 12 = 3 * 4; 13 = 3 * 4 + 1
    assert ref("multiple", 3)(-6) is True and ref("multiple", 3)(0) is True     # -6 = 3 * -2; 0 = 3 * 0
    assert ref("distance", 10)(4) == 6 and ref("distance", 10)(-5) == 15       # |4 - 10|, |-5 - 10|
    assert [ref("clamp", 3, 20)(x) for x in (-5, 3, 7, 20, 25)] == [3, 3, 7, 20, 20]
    assert ref("digit_sum")(4096) == 19 and ref("digit_sum")(0) == 0           # 4 + 0 + 9 + 6
    assert ref("factorial")(5) == 120 and ref("factorial")(0) == 1             # 1 * 2 * 3 * 4 * 5
    assert ref("transform", "reverse_string")("ab c") == "c ba"
    assert ref("transform", "to_upper")("a1 b") == "A1 B"
    assert ref("count_char", "e")("tree") == 2 and ref("count_char", "vowels")("banana") == 3
    assert ref("repeat", 3)("ab") == "ababab" and ref("repeat", 3)("") == ""
    assert ref("first_n", 3)("python") == "pyt" and ref("first_n", 3)("py") == "py" and ref("first_n", 1)("") == ""
    assert ref("palindrome")("level") is True and ref("palindrome")("") is True and ref("palindrome")("lever") is False
    assert ref("list_stat", "max_of_list")([3, 9, 2]) == 9 and ref("list_stat", "last_element")([3, 9, 2]) == 2
    assert ref("list_stat", "sum_list")([]) == 0 and ref("list_stat", "list_length")([0, 0]) == 2
    assert ref("count_above", 0)([-1, 0, 2, 5]) == 2              # 2 and 5 are positive
    assert ref("scale", 2)([1, -3]) == [2, -6]
    assert ref("keep_multiples", 2)([1, 2, 3, 4, -2, 0]) == [2, 4, -2, 0]


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(ValueError, match="unknown code families \\['nope'\\]; valid: add, mul"):
        make_code_task(4, 0, ["add", "nope"])
    with pytest.raises(ValueError, match="unknown code families"):
        make_code_task(4, 0, [])
    with pytest.raises(ValueError, match="num_prompts must be positive"):
        make_code_task(0, 0)
    with pytest.raises(ValueError, match="tests_per_prompt must be positive"):
        make_code_task(4, 0, tests_per_prompt=0)
    with pytest.raises(ValueError, match="fresh_tests must be >= 0"):
        make_code_task(4, 0, fresh_tests=-1)
    with pytest.raises(ValueError, match="too few distinct problems") as e:
        make_code_task(9, 0, ["factorial"])   # examples 3..10: 8 problems
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="too few distinct inputs"):
        make_code_task(1, 0, ["factorial"], tests_per_prompt=31)   # inputs 0..30, one is the example
    with pytest.raises(ValueError, match="not a row of the procedural code task"):
        solution({"id": "add-00000", "entry_point": "mul_3", "problem": "", "tests": []})


# ----------------------------------------------------------------------------- the edge classes and the mutant suite

EDGES = {
    # family -> inputs (given the row's constant k) every row must test, whatever it draws
    "add": lambda k: [(0,), (-k,), (-1,)],
    "mul": lambda k: [(0,), (1,), (-1,)],
    "multiple": lambda k: [(0,), (1,), (-1,), (-k,), (k - 1,), (k + 1,)],
    "distance": lambda k: [(k,), (k + 1,), (k - 1,), (0,), (-k,)],
    "digit_sum": lambda k: [(0,), (9,), (10,)],
    "factorial": lambda k: [(0,), (1,), (2,)],
    "transform": lambda k: [("",)],
    "count_char": lambda k: [("",)],
    "repeat": lambda k: [("",)],
    "first_n": lambda k: [("",)],
    "palindrome": lambda k: [("",)],
    "count_above": lambda k: [([],), ([k],), ([k + 1],)],
    "scale": lambda k: [([],)],
    "keep_multiples": lambda k: [([],)],
}


@pytest.mark.parametrize("family", list(CODE_FAMILIES))
def test_every_row_tests_its_familys_edge_classes(family):
    for row in make_code_task(8 if family == "factorial" else 40, 3, [family]):
        tail = row["entry_point"].rsplit("_", 1)[-1]
        k = int(tail) if tail.isdigit() else 0
        got = inputs(row)
        assert all(e in got for e in EDGES.get(family, lambda k: [])(k)), (row["tests"], EDGES[family](k))
        if family == "clamp":   # each bound and both its neighbours
            lo, hi = map(int, row["entry_point"].split("_")[1:])
            assert {(lo - 1,), (lo,), (lo + 1,), (hi - 1,), (hi,), (hi + 1,)} <= set(got)
        if family in ("transform", "count_char", "repeat", "first_n"):   # a long string
            assert max(len(a[0]) for a in got) > 100
        if family == "palindrome":   # long palindromes and near palindromes
            assert max(len(a[0]) for a in got) >= 30
        if family in ("list_stat", "count_above", "scale", "keep_multiples"):   # a long list
            assert max(len(a[0]) for a in got) >= 20
        if family in ("add", "distance", "clamp"):   # values far from the constants, both signs
            assert max(a[0] for a in got) >= 10**8 and min(a[0] for a in got) <= -(10**8)
        if family in ("mul", "multiple"):   # far, but not so far that a correct loop runs out of time
            assert 10**4 <= max(abs(a[0]) for a in got) <= 10**7


def _rows(family: str) -> list[dict]:
    return [r for seed in (0, 1) for r in make_code_task(8 if family == "factorial" else 30, seed, [family])]


@pytest.mark.parametrize("family", list(CODE_FAMILIES))
def test_the_tests_reject_every_mutant_and_pass_every_correct_program(family):
    # the default number of tests: each wrong program of the suite is rewarded on at most 5 % of the rows (today on
    # none: results/code/kill_rates.md), the reference and the other idioms on all, the fresh tests included
    rows = _rows(family)
    hits: dict[str, int] = {}
    for row in rows:
        for label, program in mutants(row).items():
            hits[label] = hits.get(label, 0) + rewarded(program, row["tests"])
        for label, program in {"reference": reference(row), **variants(row)}.items():
            assert rewarded(program, row["tests"] + row["fresh_tests"]), (label, program, row["tests"])
    worst = max(hits, key=hits.get)
    assert hits[worst] <= 0.05 * len(rows), (family, worst, hits[worst], len(rows))


def test_a_mutant_the_tests_miss_is_caught_by_the_fresh_tests():
    # with 2 tests (0 and -k for add_k) `x + k if -1000 < x < 1000 else x` passes; the fresh tests draw sizes up to
    # 10**9 and catch it on most rows: the holdout_fail detector
    rows = make_code_task(40, 0, ["add"], tests_per_prompt=2)
    small = {r["id"]: f"def {r['entry_point']}(x):\n    return x + {r['entry_point'][4:]} if -1000 < x < 1000 else x\n"
             for r in rows}
    assert all(rewarded(small[r["id"]], r["tests"]) for r in rows)
    caught = sum(not rewarded(small[r["id"]], r["fresh_tests"]) for r in rows)
    assert caught >= 30, caught


def test_edge_classes_hand_worked():
    multiple = CODE_FAMILIES["multiple"].build(12)
    got = multiple.edges(random.Random(0))
    # 12 = 2 * 2 * 3: the False inputs 12 // 3 = 4 and 12m + 12 // 2 = 12m + 6 hold every proper divisor of 12 (2 and
    # 4 divide 4; 3 and 6 divide 12m + 6), so `n % d == 0` fails for each; 1, -1, 11 and 13 leave the remainders 1
    # and 11 (`n % 12 <= 1`, `n % 12 == 11`)
    assert got[:7] == [(0,), (1,), (-1,), (4,), (-12,), (11,), (13,)] and got[8][0] % 12 == 6
    m = got[7][0] // 12
    assert got[7][0] % 12 == 0 and m % 11 and m % 13   # a multiple of 12, not of 11 or 13
    count_above = CODE_FAMILIES["count_above"].build(5)
    edges = count_above.edges(random.Random(0))
    first = edges[3][0]
    assert first[0] == 6 and first[-1] == 5   # [6, ..., 5]: `v >= 5` counts the 5, `v > 6` misses the 6
    assert count_above.ref(edges[4][0]) == 0
    assert count_above.ref(edges[5][0]) >= 2 and max(edges[5][0]) >= 105   # far above: a window k < v <= k + 10
    stat = CODE_FAMILIES["list_stat"].build("max_of_list")
    negatives = stat.edges(random.Random(0))[1][0]
    assert negatives[-1] == max(negatives) < 0   # the maximum last and negative: `m = 0` returns 0
    pal = [a[0] for a in CODE_FAMILIES["palindrome"].build().edges(random.Random(0))]
    near = pal[9]   # w + w[::-1] with a pair in its inner half made to differ: the first pairs all match
    assert near != near[::-1] and near[:5] == near[-5:][::-1]
