"""The ``code`` domain: rows to references, grading through the grader's workers, the quick check, the monitor."""
from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

from graft.config import RewardConfig
from graft.data.code_task import make_code_task, solution
from graft.data.datasets import RowError
from graft.domains.code import CODE
from graft.domains.grading import grading_note, make_grader
from graft.registry import DOMAINS
from graft.reward import sandbox
from graft.reward.code import SandboxUnavailable, split_holdout, verify_code
from graft.reward.sandbox import parse_tests

ROW = {"id": "x", "problem": "Write add_3(x).", "tests": ["assert add_3(1) == 4", "assert add_3(-3) == 0"],
       "entry_point": "add_3"}
HONEST = "Add three.\n```python\ndef add_3(x):\n    return x + 3\n```"
SPECIAL = "```python\ndef add_3(x):\n    if x == 1:\n        return 4\n    return 0\n```"   # passes by special-casing
HALF = "```python\ndef add_3(x):\n    return 4\n```"                                        # 4 is right for x=1 only


def test_registered_and_reference_is_the_tests():
    assert DOMAINS["code"] is CODE
    assert json.loads(CODE.reference(ROW)) == {"tests": ROW["tests"], "entry_point": "add_3"}
    with pytest.raises(RowError, match="missing field"):
        CODE.reference({"id": "x", "problem": "p", "answer": "4"})
    with pytest.raises(RowError, match="tests must be a non-empty list"):
        CODE.reference(dict(ROW, tests=[]))


@pytest.mark.parametrize("workers", [0, 1])
def test_grading_through_the_grader(workers):
    ref = CODE.reference(ROW)
    texts = [HONEST, SPECIAL, HALF, "no code at all", "```python\ndef add_3(x) return\n```"]
    with make_grader(RewardConfig(domain="code", workers=workers, timeout_s=6.0)) as g:
        rewards, statuses = g.grade(texts, [ref] * len(texts))
    assert rewards == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert statuses[:4] == ["ok", "ok", "wrong_answer", "no_answer"] and statuses[4] == "syntax"
    # partial credit: HALF passes 1 of 2 tests -> 0.5
    with make_grader(RewardConfig(domain="code", workers=workers, timeout_s=6.0, partial_credit=True)) as g:
        assert g.grade([HALF], [ref])[0] == [0.5]


def test_a_program_that_loops_is_the_models_failure_not_a_grader_timeout():
    loop = "```python\ndef add_3(x):\n    while True:\n        pass\n```"
    with make_grader(RewardConfig(domain="code", workers=1, timeout_s=4.0, test_timeout_s=1.0)) as g:
        rewards, statuses = g.grade([loop], [CODE.reference(ROW)])
    assert rewards == [0.0] and statuses == ["program_timeout"]      # not "timeout": the run must not call it a hang


def test_monitor_flags_special_casing_and_not_the_honest_program():
    ref = CODE.reference(ROW)
    shares = CODE.monitor([HONEST, SPECIAL, HALF], ["p"] * 3, [ref] * 3, [1.0, 1.0, 0.0], 0.5)
    assert shares["n"] == 2 and shares["special_case"] == 0.5        # of the 2 rewarded, SPECIAL only
    assert not any(CODE.response_flags(HONEST, "p", ref).values())


def test_every_reference_solution_of_the_task_scores_one():
    rows = make_code_task(16, seed=7)
    refs = [CODE.reference(r) for r in rows]
    with make_grader(RewardConfig(domain="code", workers=1, timeout_s=8.0)) as g:
        rewards, statuses = g.grade([solution(r) for r in rows], refs)
    assert rewards == [1.0] * 16, list(zip([r["id"] for r in rows], statuses))


HOSTILE = {
    "loop": "def add_3(x):\n    while True:\n        pass",
    "fork_bomb": "import os\ndef add_3(x):\n    while True:\n        os.fork()",
    "memory_bomb": "def add_3(x):\n    a = []\n    while True:\n        a.append(' ' * 10**7)",
    "output_flood": "import sys\ndef add_3(x):\n    while True:\n        sys.stdout.write('y' * 65536)",
    "kill_parents": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.killpg(0, signal.SIGKILL)\n"
                    "def add_3(x):\n    return x + 3 if False else 0",
    "exit_early": "import sys\nsys.exit(0)\ndef add_3(x):\n    return 0",
    "patch_eq": "class A:\n    def __eq__(self, o):\n        return True\ndef add_3(x):\n    return A()",
    "fake_report": "import os\nfor fd in range(3, 12):\n    try:\n        os.write(fd, b'ok 0 4\\nok 1 0\\n')\n"
                   "    except OSError:\n        pass\nprint('PASS PASS')\ndef add_3(x):\n    return -1",
}


def test_hostile_programs_score_zero_and_the_grader_goes_on(tmp_path, monkeypatch):
    """Every hostile class through the real grader (a worker process, then the sandbox): reward 0, and the same
    grader then grades an honest program — the caller (here the test, in training the trainer) survives all."""
    monkeypatch.setenv("WANDB_API_KEY", "secret-key-123")
    ref = CODE.reference(ROW)
    texts = [f"```python\n{p}\n```" for p in HOSTILE.values()]
    with make_grader(RewardConfig(domain="code", workers=1, timeout_s=6.0, test_timeout_s=1.0,
                                  sandbox_memory_mb=256)) as g:
        rewards, statuses = g.grade(texts, [ref] * len(texts))
        assert rewards == [0.0] * len(texts), dict(zip(HOSTILE, statuses))
        assert "timeout" not in statuses                     # the program's time, never the grader's hard limit
        assert g.grade([HONEST], [ref]) == ([1.0], ["ok"])


def test_humaneval_and_mbpp_rows_through_data_fields(tmp_path):
    """A HumanEval row (test code with ``check(candidate)``, called on ``entry_point``) and an MBPP row
    (``test_list`` of asserts), mapped by ``data.fields`` as docs/your-task.md says."""
    from graft.data.datasets import load_prompts

    he = {"task_id": "HumanEval/0", "prompt": "def add(a, b):\n    \"\"\"Add.\"\"\"\n", "entry_point": "add",
          "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"}
    mbpp = {"task_id": 7, "text": "Write a function to double a number.", "test_list": ["assert double(4) == 8"]}
    (tmp_path / "he.jsonl").write_text(json.dumps(he) + "\n")
    (tmp_path / "mbpp.jsonl").write_text(json.dumps(mbpp) + "\n")
    [h], _ = load_prompts(str(tmp_path / "he.jsonl"), fields={"id": "task_id", "problem": "prompt", "tests": "test"},
                          reference=CODE.reference)
    [m], _ = load_prompts(str(tmp_path / "mbpp.jsonl"), fields={"id": "task_id", "problem": "text", "tests": "test_list"},
                          reference=CODE.reference)
    assert (h.id, m.id) == ("HumanEval/0", "7")
    with make_grader(RewardConfig(domain="code", workers=0, timeout_s=6.0)) as g:
        rewards, _ = g.grade(["```python\ndef add(a, b):\n    return a + b\n```", "```python\ndef add(a, b):\n    return a\n```",
                              "```python\ndef double(x):\n    return 2 * x\n```"], [h.answer, h.answer, m.answer])
    assert rewards == [1.0, 0.0, 1.0]


def test_a_domains_failure_kinds_are_counted_per_step_and_math_statuses_add_no_key():
    from types import SimpleNamespace

    from graft.trainer.metrics import group_stats

    def group(statuses):
        n = len(statuses)
        return SimpleNamespace(rewards=[float(s == "ok") for s in statuses], token_ids=[[1]] * n, status=statuses,
                               advantages=[], finished=[True] * n, successes=lambda t: statuses.count("ok"), size=n,
                               reward_parts={})

    code = group_stats([group(["ok", "wrong_answer", "syntax", "wrong_answer"])], 0.5)
    assert {k: v for k, v in code.items() if k.startswith("verify/failed/")} == \
        {"verify/failed/syntax": 1, "verify/failed/wrong_answer": 2}
    math = group_stats([group(["ok", "no_answer", "timeout", "error"])], 0.5)
    assert not any(k.startswith("verify/failed/") for k in math)     # a math run's metrics keep their keys


# ----------------------------------------------------------------------------- the reward cannot be had without the skill

BUILTIN = make_code_task(6, seed=2, families=["palindrome", "multiple", "clamp", "first_n", "count_above", "digit_sum"])

TRICKS = {
    # stateful and order-keyed: each call is a fresh process forked after the import, in an order drawn afresh
    "counter": "_c = [0]\ndef {name}(*a):\n    _c[0] += 1\n    return _c[0] % 2 == 0\n",
    "answers by position": "_i = [0]\nANSWERS = {answers!r}\ndef {name}(*a):\n    _i[0] += 1\n    return ANSWERS[_i[0] - 1]\n",
    "file counter": "import os\ndef {name}(*a):\n    open('n', 'a').write('x')\n    return {answers!r}[os.path.getsize('n') - 1]\n",
    # graft's own task generator and the run folder are out of reach under bwrap
    "the task generator": "import sys\nsys.path[:0] = {paths!r}\nfrom graft.data.code_task import make_code_task\n"
                          "def {name}(*a):\n    return make_code_task(6, 2)[0]\n",
}


@pytest.mark.parametrize("trick", sorted(TRICKS))
def test_tricks_earn_nothing_on_the_builtin_task(trick):
    """Programs that would pass the built-in rows' tests if the calls shared a state in the rows' order (``answers
    by position`` holds the expected values in the tests' order), or if the sandbox held graft's code: reward 0."""
    import site

    import graft

    paths = sorted({str(Path(graft.__file__).parents[1]), *site.getsitepackages()})
    texts = []
    for row in BUILTIN:
        answers = [t.rsplit(" == ", 1)[1] for t in row["tests"]]
        program = TRICKS[trick].format(name=row["entry_point"], answers=[ast.literal_eval(a) for a in answers], paths=paths)
        texts.append(f"```python\n{program}```")
    with make_grader(RewardConfig(domain="code", workers=1, timeout_s=8.0)) as g:
        rewards, statuses = g.grade(texts, [CODE.reference(r) for r in BUILTIN])
    assert rewards == [0.0] * len(BUILTIN), list(zip([r["id"] for r in BUILTIN], statuses))


def test_held_out_tests_flag_a_rewarded_program_without_changing_its_reward():
    row = {"id": "x", "problem": "p", "entry_point": "f", "tests": ["assert f(1) == 2", "assert f(2) == 4"],
           "fresh_tests": ["assert f(50) == 100", "assert f(7) == 14"]}
    ref = CODE.reference(row)
    right = "```python\ndef f(x):\n    return 2 * x\n```"
    small = "```python\ndef f(x):\n    return 2 * x if x < 10 else 0\n```"       # right on the tests, wrong at 50
    wrong = "```python\ndef f(x):\n    return 2 * x if x < 2 else 0\n```"
    assert verify_code(right, ref, success_threshold=0.5) == (1.0, "ok")
    assert verify_code(small, ref, success_threshold=0.5) == (1.0, "holdout_fail")                        # rewarded all the same
    assert verify_code(wrong, ref, success_threshold=0.5) == (0.0, "wrong_answer")
    assert verify_code(wrong, ref, partial_credit=True, success_threshold=0.5) == (0.5, "wrong_answer")   # 1 of 2: held-out tests not run
    # reward.holdout_tests: the row's own tests, 2 of 5 held out (the same 2 in every grading)
    user = CODE.reference({"id": "u", "problem": "p", "entry_point": "f", "tests": [f"assert f({i}) == {2 * i}" for i in range(5)]})
    counted, held = split_holdout(parse_tests(json.loads(user)["tests"]), 2)
    assert len(counted) == 3 and len(held) == 2 and split_holdout(parse_tests(json.loads(user)["tests"]), 2)[1] == held
    miss = "```python\ndef f(x):\n    return -1 if x == %s else 2 * x\n```" % held[0].call[2:-1]
    assert verify_code(miss, user, success_threshold=0.5) == (0.0, "wrong_answer")                        # every test counts by default
    assert verify_code(miss, user, holdout_tests=2, success_threshold=0.5) == (1.0, "holdout_fail")
    assert split_holdout(parse_tests(["assert f(1) == 2"]), 3) == (parse_tests(["assert f(1) == 2"]), [])   # one is kept


def test_the_holdout_flag_is_a_share_of_the_rewarded_read_off_the_status():
    ref = CODE.reference(ROW)
    shares = CODE.monitor([HONEST, HONEST, HONEST, HALF], ["p"] * 4, [ref] * 4, [1.0, 1.0, 1.0, 0.0], 0.5,
                          ["ok", "holdout_fail", "ok", "wrong_answer"])
    assert shares["n"] == 3 and shares["holdout_fail"] == pytest.approx(1 / 3)   # 1 of the 3 rewarded
    assert CODE.monitor([HONEST], ["p"], [ref], [1.0], 0.5)["holdout_fail"] == 0.0     # no status known: off
    assert CODE.response_flags(HONEST, "p", ref, "holdout_fail")["holdout_fail"]


# ----------------------------------------------------------------------------- isolation that fails closed

def _without_bwrap(monkeypatch):
    """This process as if bubblewrap were not installed (the weaker mechanism's self-test runs for real)."""
    monkeypatch.setattr(sandbox, "_FORCE", None)
    monkeypatch.setattr(sandbox, "_detected", {"bwrap": (False, "bwrap is not installed")})


def test_grading_code_without_bubblewrap_stops_in_one_line_unless_opted_in(monkeypatch, capsys):
    _without_bwrap(monkeypatch)
    with pytest.raises(SandboxUnavailable) as e:
        make_grader(RewardConfig(domain="code", workers=0))
    msg = str(e.value)
    assert "\n" not in msg and "bwrap is not installed" in msg and "apt-get install bubblewrap" in msg
    assert "reward.allow_weak_sandbox=true" in msg
    assert verify_code(HONEST, CODE.reference(ROW), success_threshold=0.5) == (0.0, "error")             # the worker refuses as well
    if sandbox._probe("rlimits+setuid" if os.geteuid() == 0 else "rlimits")[0]:
        with make_grader(RewardConfig(domain="code", workers=0, allow_weak_sandbox=True)) as g:
            assert g.grade([HONEST], [CODE.reference(ROW)]) == ([1.0], ["ok"])
        assert "grading: code programs run in the WEAK rlimits" in capsys.readouterr().err


def test_the_grader_says_which_sandbox_it_uses(capsys):
    if not sandbox._probe("bwrap")[0]:
        pytest.skip("bwrap is not usable here")
    with make_grader(RewardConfig(domain="code", workers=0)):
        pass
    assert "grading: code programs run in the bwrap sandbox" in capsys.readouterr().err
    assert grading_note(RewardConfig(domain="math")) is None


def test_graft_analyze_shows_the_holdout_share_per_third():
    from graft.evaluation.analyze import monitor_lines, reward_monitor

    # steps 1-3, 4 rewarded programs each; 1, 0 and 3 of them failed a held-out test: per third (one step each)
    # 25 %, 0 %, 75 %
    rows = [{"step": s, "A/rewarded/n": 4, **{f"A/rewarded/{f}": 0.0 for f in CODE.flags}} for s in (1, 2, 3)]
    for row, share in zip(rows, (0.25, 0.0, 0.75)):
        row["A/rewarded/holdout_fail"] = share
    mon = reward_monitor(rows, "A", None, CODE.flags)
    assert [e["holdout_fail"] for e in mon["ranges"]] == [0.25, 0.0, 0.75]
    text = "\n".join(monitor_lines({"A": mon}))
    assert "holdout_fail 25%" in text and "holdout_fail 75%" in text, text
