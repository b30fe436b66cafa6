"""The ``code`` domain: rows to references, grading through the grader's workers, the quick check, the monitor."""
from __future__ import annotations

import json

import pytest

from graft.config import RewardConfig
from graft.data.code_task import make_code_task, solution
from graft.data.datasets import RowError
from graft.domains.code import CODE
from graft.domains.grading import make_grader
from graft.registry import DOMAINS

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
    shares = CODE.monitor([HONEST, SPECIAL, HALF], ["p"] * 3, [ref] * 3, [1.0, 1.0, 0.0])
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
                               advantages=[], finished=[True] * n, num_correct=statuses.count("ok"), size=n)

    code = group_stats([group(["ok", "wrong_answer", "syntax", "wrong_answer"])])
    assert {k: v for k, v in code.items() if k.startswith("verify/failed/")} == \
        {"verify/failed/syntax": 1, "verify/failed/wrong_answer": 2}
    math = group_stats([group(["ok", "no_answer", "timeout", "error"])])
    assert not any(k.startswith("verify/failed/") for k in math)     # a math run's metrics keep their keys
