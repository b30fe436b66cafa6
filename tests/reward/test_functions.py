"""``reward.function``: a user's own reward functions (:class:`graft.reward.functions.FunctionGrader`).

Every behaviour is checked in-process (``workers=0``) and in a real worker process (``workers=1``, what training
uses); the hang only a worker can bound. A worker start costs seconds on one core (it imports torch), so each
failure mode runs in a worker once, under ``on_error=stop`` or ``zero``, and in-process under both. The functions
live in tests/reward/user_rewards.py (``package.module:name``) or in files written to tmp_path (``path/file.py:name``).
"""
from __future__ import annotations

import json
import time

import pytest

from graft.config import ConfigError, RewardConfig, load_config
from graft.domains.grading import make_grader
from graft.reward.functions import FunctionGrader, RewardFunctionError, function_names, row_reference

M = "tests.reward.user_rewards:"

ROWS = [
    {"id": "q1", "problem": "What is 2+3?", "answer": "5", "difficulty": 3},
    {"id": "q2", "problem": "What is 4*5?", "answer": "20", "difficulty": 5},
]
REFS = [row_reference(r) for r in ROWS]


@pytest.fixture(params=[0, 1], ids=["in-process", "worker"])
def workers(request):
    return request.param


def grade_once(specs, responses, refs=REFS, workers=0, **kw):
    with FunctionGrader(specs, workers=workers, **kw) as g:
        return g.grade(responses, refs)


# ----------------------------------------------------------------------------- values

@pytest.mark.parametrize("spec,responses,expected,workers", [
    ("quarter", ["abc", "abcdef"], [0.25, 0.25], 0),
    ("seven_tenths", ["abc", "abcdef"], [0.7, 0.7], 0),
    ("length_tenths", ["abc", "abcdefg"], [0.3, 0.7], 0),      # len 3 -> 3/10, len 7 -> 7/10
    ("length_tenths", ["abc", "abcdefg"], [0.3, 0.7], 1),
    ("numpy_values", ["abc", "abcdef"], [0.125, 0.125], 0),    # a float32 array, exactly representable
])
def test_values_come_back_unchanged(spec, responses, expected, workers):
    rewards, statuses = grade_once([M + spec], responses, workers=workers)
    assert rewards == expected                                  # not rounded, not thresholded to 0/1
    assert statuses == ["ok", "ok"]


def test_weighted_sum_of_several_functions(workers):
    # 0.5 * quarter + 2 * length_tenths:
    #   "abc"    -> 0.5 * 0.25 + 2 * 0.3 = 0.125 + 0.6 = 0.725
    #   "abcdef" -> 0.5 * 0.25 + 2 * 0.6 = 0.125 + 1.2 = 1.325
    rewards, statuses = grade_once([M + "quarter", M + "length_tenths"], ["abc", "abcdef"], workers=workers,
                                   weights=[0.5, 2.0])
    assert rewards == pytest.approx([0.725, 1.325], abs=1e-12)
    assert statuses == ["ok", "ok"]


def test_weights_default_to_one_each():
    # quarter + length_tenths: "abcd" -> 0.25 + 0.4 = 0.65
    rewards, _ = grade_once([M + "quarter", M + "length_tenths"], ["abcd", "ab"])
    assert rewards == pytest.approx([0.65, 0.45], abs=1e-12)     # "ab" -> 0.25 + 0.2


def test_each_functions_own_values_come_back_beside_the_weighted_sum(workers):
    # 0.5 * none_on_question_mark + 2 * length_tenths, each function's values by its name:
    #   "why?" -> none_on_question_mark None, length_tenths 0.4: reward 2 * 0.4 = 0.8
    #   "abcdef" -> 0.4 and 0.6: reward 0.5 * 0.4 + 2 * 0.6 = 0.2 + 1.2 = 1.4
    with FunctionGrader([M + "none_on_question_mark", M + "length_tenths"], workers=workers, weights=[0.5, 2.0]) as g:
        rewards, statuses, parts = g.grade_parts(["why?", "abcdef"], REFS)
        assert (rewards, statuses) == g.grade(["why?", "abcdef"], REFS)     # grade() is grade_parts() without parts
    assert rewards == pytest.approx([0.8, 1.4], abs=1e-12) and statuses == ["ok", "ok"]
    assert parts == {"none_on_question_mark": [None, 0.4], "length_tenths": [0.4, 0.6]}


def test_a_batch_scored_zero_has_no_function_values(capsys):
    with FunctionGrader([M + "quarter", M + "raises"], workers=0, on_error="zero") as g:
        rewards, statuses, parts = g.grade_parts(["abc", "abcdef"], REFS)
    assert rewards == [0.0, 0.0] and parts == {"quarter": [None, None], "raises": [None, None]}
    assert "this batch of 2 scores 0" in capsys.readouterr().err


def test_function_names_are_the_callables_names_as_trl_names_them():
    assert function_names(["pkg.mod:correct", "path/to/r.py:fmt"]) == ["correct", "fmt"]
    assert function_names(["a.py:score", "b.py:score", "c:other"]) == ["score_0", "score_1", "other"]   # shared: position

    def my_reward(prompts, completions, **kw):
        return [0.0] * len(completions)

    assert function_names([my_reward, "m:x"]) == ["my_reward", "x"]


def test_every_function_none_is_no_answer():
    rewards, statuses = grade_once([M + "always_none"], ["why?", "sure"])
    assert (rewards, statuses) == ([0.0, 0.0], ["no_answer", "no_answer"])


def test_none_means_not_gradable(workers):
    # 0.5 * none_on_question_mark + 2 * quarter:
    #   "why?" -> None and 0.25: only the value counts, 2 * 0.25 = 0.5
    #   "sure" -> 0.4 and 0.25: 0.5 * 0.4 + 2 * 0.25 = 0.2 + 0.5 = 0.7
    rewards, statuses = grade_once([M + "none_on_question_mark", M + "quarter"], ["why?", "sure"], workers=workers,
                                   weights=[0.5, 2.0])
    assert rewards == pytest.approx([0.5, 0.7], abs=1e-12) and statuses == ["ok", "ok"]
    # one None, one function always None: "why?" has nothing -> 0 no_answer; "sure" -> 0.5 * 0.4 = 0.2
    rewards, statuses = grade_once([M + "none_on_question_mark", M + "always_none"], ["why?", "sure"],
                                   workers=workers, weights=[0.5, 2.0])
    assert rewards == pytest.approx([0.0, 0.2], abs=1e-12) and statuses == ["no_answer", "ok"]


def test_columns_reach_the_function_as_keyword_lists(workers, tmp_path):
    log = tmp_path / "seen.json"
    rows = [dict(r, log=str(log)) for r in ROWS]
    rewards, statuses = grade_once([M + "record"], ["The answer is 5.", "21"], [row_reference(r) for r in rows],
                                   workers=workers)
    assert rewards == [0.5, 0.5] and statuses == ["ok", "ok"]
    seen = json.loads(log.read_text())
    assert seen["prompts"] == ["What is 2+3?", "What is 4*5?"]         # the problems, nothing appended
    assert seen["completions"] == ["The answer is 5.", "21"]
    assert seen["columns"] == {"id": ["q1", "q2"], "answer": ["5", "20"], "difficulty": [3, 5],
                               "log": [str(log), str(log)],            # every column but problem, one list each
                               "completion_ids": [None, None]}         # no tokens given: None each


def test_completion_ids_and_a_conversation_reach_the_function_as_trl_gives_them(workers, tmp_path):
    log = tmp_path / "seen.json"
    talk = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]
    refs = [row_reference({"id": "c1", "problem": talk, "log": str(log)}),
            row_reference({"id": "t1", "problem": "What is 4*5?", "log": str(log)})]
    with FunctionGrader([M + "record"], workers=workers) as g:
        g.grade(["5", "20"], refs, completion_ids=[[7, 8, 2], [9]])
    seen = json.loads(log.read_text())
    assert seen["prompts"] == [talk, "What is 4*5?"]                    # a conversation's messages, as written
    assert seen["completions"] == [[{"role": "assistant", "content": "5"}], "20"]     # TRL's form for a conversation
    assert seen["columns"] == {"id": ["c1", "t1"], "log": [str(log)] * 2, "completion_ids": [[7, 8, 2], [9]]}


def test_a_column_named_like_an_argument_is_refused():
    with pytest.raises(RewardFunctionError, match="data column 'completion_ids' has the name of a reward function's"):
        grade_once([M + "quarter"], ["x"], [row_reference({"id": "a", "problem": "p", "completion_ids": [1]})])


def test_an_extra_column_decides_the_reward():
    # by_difficulty: difficulty / 10 when the completion is the answer: q1 "5" -> 3/10 = 0.3; q2 "21" != "20" -> 0
    rewards, statuses = grade_once([M + "by_difficulty"], ["5", "21"])
    assert rewards == [0.3, 0.0] and statuses == ["ok", "ok"]


def test_rows_with_different_columns_get_none_for_the_missing_ones(tmp_path):
    log = tmp_path / "seen.json"
    refs = [row_reference({"id": "a", "problem": "p", "log": str(log), "hint": "h"}),
            row_reference({"id": "b", "problem": "q", "log": str(log)})]
    grade_once([M + "record"], ["x", "y"], refs)
    assert json.loads(log.read_text())["columns"] == {"id": ["a", "b"], "hint": ["h", None], "log": [str(log)] * 2,
                                                      "completion_ids": [None, None]}


def test_empty_batch_calls_nothing():
    assert grade_once([M + "raises"], [], []) == ([], [])


# ----------------------------------------------------------------------------- failures: one line naming the function

FAILURES = [
    ("raises", "raised ValueError: cannot parse completion 2"),
    ("one_short", "returned 1 values for 2 completions"),
    ("nan_second", "returned nan for completion 1 (not finite)"),
    ("inf_first", "returned inf for completion 0 (not finite)"),
    ("word_values", "returned str 'high' for completion 0, not a float or None"),
    ("returns_scalar", "returned float 1.0, not a list of floats (one per completion)"),
    # by type, not by what float() or iteration would make of it: a dict's keys are [0, 1], not its rewards
    ("dict_of_rewards", "returned dict {0: 1.0, 1: 0.0}, not a list of floats (one per completion)"),
    ("digit_string", "returned str '10', not a list of floats (one per completion)"),
    ("digit_strings", "returned str '1' for completion 0, not a float or None"),
    ("nested_lists", "returned list [0.5] for completion 0, not a float or None"),
    ("bools", "returned bool True for completion 0, not a float or None"),
    ("generator", "returned generator <generator object generator.<locals>.<genexpr>"),
]


IN_WORKER_STOP = ("raises", "one_short", "nan_second", "dict_of_rewards")
"""The failure modes also run in a worker under on_error=stop; the others under on_error=zero."""


def _modes(in_worker):
    return [pytest.param(w, name, why, id=f"{'worker' if w else 'in-process'}-{name}")
            for name, why in FAILURES for w in ((0, 1) if name in in_worker else (0,))]


@pytest.mark.parametrize("workers,name,why", _modes(IN_WORKER_STOP))
def test_failure_stops_with_one_line_naming_the_function(workers, name, why):
    with FunctionGrader([M + "quarter", M + name], workers=workers, on_error="stop") as g:
        with pytest.raises(RewardFunctionError) as e:
            g.grade(["abc", "abcdef"], REFS)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"reward function {M}{name} {why}" in msg            # the failing one, not quarter before it
    assert "quarter" not in msg
    assert "reward.on_error=zero" in msg                         # how to keep going instead


@pytest.mark.parametrize("workers,name,why", _modes({f[0] for f in FAILURES} - set(IN_WORKER_STOP)))
def test_failure_under_on_error_zero_scores_the_batch_zero(workers, name, why, capsys):
    with FunctionGrader([M + name], workers=workers, on_error="zero") as g:
        assert g.grade(["abc", "abcdef"], REFS) == ([0.0, 0.0], ["function_error", "function_error"])
        assert g.stats == {"function_error": 2}
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: ")
    assert f"reward function {M}{name} {why}" in err[0] and "this batch of 2 scores 0" in err[0]


def test_hang_stops_within_the_timeout():
    with FunctionGrader([M + "hangs"], timeout_s=1.0, workers=1, on_error="stop") as g:
        t0 = time.monotonic()
        with pytest.raises(RewardFunctionError) as e:
            g.grade(["abc", "abcdef"], REFS)
        took = time.monotonic() - t0
    assert 1.0 <= took < 4.0                                      # the function sleeps 60 s
    msg = str(e.value)
    assert "\n" not in msg
    assert f"reward function {M}hangs on 2 completions took longer than reward.function_timeout_s=1s" in msg


def test_hang_under_on_error_zero_then_a_fresh_worker_grades_the_next_batch(capsys):
    with FunctionGrader([M + "hangs_on_slow"], timeout_s=1.0, workers=1, on_error="zero") as g:
        first_worker = g._proc.pid
        t0 = time.monotonic()
        assert g.grade(["slow", "x"], REFS) == ([0.0, 0.0], ["function_timeout", "function_timeout"])
        assert time.monotonic() - t0 < 4.0
        assert g.grade(["fast", "x"], REFS) == ([0.9, 0.9], ["ok", "ok"])
        assert g._proc.pid != first_worker                        # the hung one was killed
        assert g.stats == {"function_timeout": 2, "ok": 2}
    err = capsys.readouterr().err
    assert err.count("warning: ") == 1 and f"{M}hangs_on_slow" in err and "timeout_s=1s" in err


def test_a_worker_that_dies_is_one_line_naming_the_function(tmp_path):
    f = tmp_path / "dies.py"
    f.write_text("import os\n\ndef score(prompts, completions, **columns):\n    os._exit(3)\n")
    with FunctionGrader([f"{f}:score"], timeout_s=10.0, workers=1) as g:
        with pytest.raises(RewardFunctionError) as e:
            g.grade(["abc"], REFS[:1])
    msg = str(e.value)
    assert "\n" not in msg and "worker died" in msg and f"reward function {f}:score on 1 completions" in msg


# ----------------------------------------------------------------------------- naming a function

REWARD_FILE = """
def score(prompts, completions, **columns):
    # 0.1 per character of the completion beyond the answer's length, at most 0.5
    return [min(0.5, 0.1 * max(0, len(c) - len(str(a)))) for c, a in zip(completions, columns["answer"])]
"""


def test_function_from_a_file_outside_the_project(workers, tmp_path):
    f = tmp_path / "elsewhere" / "my_reward.py"
    f.parent.mkdir()
    f.write_text(REWARD_FILE)
    # "5" vs "5!!" -> 2 extra characters -> 0.2; "20" vs "20 is it, surely" -> 14 extra -> capped at 0.5
    rewards, statuses = grade_once([f"{f}:score"], ["5!!", "20 is it, surely"], workers=workers)
    assert rewards == pytest.approx([0.2, 0.5], abs=1e-12) and statuses == ["ok", "ok"]


def test_function_from_a_relative_file_path(tmp_path, monkeypatch):
    (tmp_path / "my_reward.py").write_text(REWARD_FILE)
    monkeypatch.chdir(tmp_path)
    rewards, _ = grade_once(["my_reward.py:score"], ["5", "200"])        # 0 extra -> 0; 1 extra -> 0.1
    assert rewards == pytest.approx([0.0, 0.1], abs=1e-12)


def test_function_from_a_module_with_file_and_module_mixed(tmp_path):
    f = tmp_path / "my_reward.py"
    f.write_text(REWARD_FILE)
    # 1 * score + 1 * quarter: "5!!" -> 0.2 + 0.25 = 0.45
    rewards, _ = grade_once([f"{f}:score", M + "quarter"], ["5!!", "20"])
    assert rewards == pytest.approx([0.45, 0.25], abs=1e-12)


def _bad_specs(tmp_path):
    raising = tmp_path / "raising.py"
    raising.write_text("import no_such_module_for_graft_tests\n\ndef score(prompts, completions, **k):\n    return []\n")
    broken = tmp_path / "broken.py"
    broken.write_text("def score(prompts, completions, **k)\n    return []\n")
    return {
        "import_error": (f"{raising}:score",
                         f"cannot import '{raising}': ModuleNotFoundError: No module named 'no_such_module_for_graft_tests'"),
        "syntax_error": (f"{broken}:score", f"cannot import '{broken}': SyntaxError"),
        "missing_file": (f"{tmp_path / 'absent.py'}:score", f"file not found: {tmp_path / 'absent.py'}"),
        "missing_module": ("no_such_module_for_graft_tests:score",
                           "cannot import 'no_such_module_for_graft_tests': ModuleNotFoundError"),
        "missing_attribute": (M + "no_such_function", "'tests.reward.user_rewards' has no attribute 'no_such_function'"),
        "no_colon": ("tests.reward.user_rewards.quarter", "must look like 'package.module:name'"),
        "empty_name": ("tests.reward.user_rewards:", "must look like 'package.module:name'"),
        "not_an_identifier": ("tests.reward.user_rewards:not-a-name", "must look like 'package.module:name'"),
    }


@pytest.mark.parametrize("case", ["import_error", "syntax_error", "missing_file", "missing_module", "missing_attribute",
                                  "no_colon", "empty_name", "not_an_identifier"])
def test_unloadable_function_is_a_one_line_error(tmp_path, case):
    spec, why = _bad_specs(tmp_path)[case]
    with pytest.raises(RewardFunctionError) as e:
        FunctionGrader([M + "quarter", spec], workers=0)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("reward.function.1: ") and why in msg, msg


@pytest.mark.parametrize("case", ["import_error", "missing_attribute"])
def test_unloadable_function_in_the_worker_is_the_same_one_line_error(tmp_path, case):
    spec, why = _bad_specs(tmp_path)[case]
    t0 = time.monotonic()
    with pytest.raises(RewardFunctionError) as e:
        FunctionGrader([spec], workers=1)                          # raised at start, before any batch
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("reward.function.0: ") and why in msg, msg
    assert time.monotonic() - t0 < 60


# ----------------------------------------------------------------------------- through the config

MODELS = "models=[{name: A, path: /nowhere/a}, {name: B, path: /nowhere/b}]"


def test_config_line_builds_the_function_grader(tmp_path):
    f = tmp_path / "my_reward.py"
    f.write_text(REWARD_FILE)
    cfg = load_config(None, [MODELS, f"reward.function={f}:score", "reward.workers=0"])
    assert cfg.reward.function == [f"{f}:score"]                   # one string becomes a list of one
    with make_grader(cfg.reward) as g:
        assert isinstance(g, FunctionGrader)
        rewards, statuses = g.grade(["5!!", "20"], REFS)
    assert rewards == pytest.approx([0.2, 0.0], abs=1e-12) and statuses == ["ok", "ok"]


def test_config_weights_timeout_and_on_error_reach_the_grader():
    cfg = load_config(None, [MODELS, f"reward.function=[{M}quarter, {M}length_tenths]", "reward.weights=[0.5, 2]",
                             "reward.function_timeout_s=7", "reward.on_error=zero", "reward.workers=0"])
    with make_grader(cfg.reward) as g:
        assert (g.weights, g.timeout_s, g.on_error) == ([0.5, 2.0], 7.0, "zero")
        assert g.grade(["abc"], REFS[:1])[0] == pytest.approx([0.725], abs=1e-12)   # 0.125 + 0.6


@pytest.mark.parametrize("override,key", [
    ("reward.weights=[1.0]", "reward.weights"),                    # one weight for two functions
    ("reward.weights=[1.0, .nan]", "reward.weights"),
    ("reward.function_timeout_s=0", "reward.function_timeout_s"),
    ("reward.on_error=ignore", "reward.on_error"),
])
def test_config_refuses_bad_reward_function_settings(override, key):
    with pytest.raises(ConfigError) as e:
        load_config(None, [MODELS, f"reward.function=[{M}quarter, {M}seven_tenths]", override])
    assert str(e.value).startswith(key) and "\n" not in str(e.value)


def test_config_refuses_a_function_without_a_name():
    with pytest.raises(ConfigError) as e:
        load_config(None, [MODELS, "reward.function=tests.reward.user_rewards"])
    assert str(e.value).startswith("reward.function.0:") and "package.module:callable" in str(e.value)


def test_reward_config_alone_accepts_one_string():
    assert RewardConfig(function=M + "quarter").function == [M + "quarter"]


# ----------------------------------------------------------------------------- start-up, a dying worker, a bad reference

def test_start_up_timeout_names_the_function_and_its_limit(tmp_path):
    f = tmp_path / "slow_import.py"
    f.write_text("import time\ntime.sleep(60)\n\ndef score(prompts, completions, **k):\n    return [0.1] * len(completions)\n")
    with pytest.raises(RewardFunctionError) as e:
        FunctionGrader([f"{f}:score"], timeout_s=30.0, workers=1, startup_timeout_s=1.0)
    msg = str(e.value)
    assert f"{f}:score" in msg and "function_timeout_s=30" not in msg, msg


def test_a_dead_worker_reports_its_exit_code(tmp_path):
    f = tmp_path / "dies.py"
    f.write_text("import os\n\ndef score(prompts, completions, **columns):\n    os._exit(3)\n")
    with FunctionGrader([f"{f}:score"], timeout_s=10.0, workers=1) as g:
        with pytest.raises(RewardFunctionError) as e:
            g.grade(["abc"], REFS[:1])
    assert "exit code 3" in str(e.value), str(e.value)


@pytest.mark.parametrize("reference", ["19", "x + 1"])
def test_a_reference_that_is_not_a_row_is_a_one_line_error(reference):
    with FunctionGrader([M + "quarter"], workers=0) as g:
        with pytest.raises(RewardFunctionError):
            g.grade(["abc"], [reference])


def test_a_worker_over_its_memory_limit_fails_the_batch_and_its_peak_is_reported():
    """reward.function_memory_mb bounds the worker's resident memory (it had no limit); the peak of the worker,
    which the trainer's own peak does not include, goes into the run's summary (peak_rss_gb of the grader)."""
    with FunctionGrader([M + "hoards_memory"], timeout_s=30.0, workers=1, on_error="stop", memory_mb=400) as g:
        with pytest.raises(RewardFunctionError) as e:
            g.grade(["abc", "abcdef"], REFS)
        assert g.peak_rss_gb > 400 / 1024
    msg = str(e.value)
    assert "reward function worker used" in msg and "more than reward.function_memory_mb=400" in msg and "\n" not in msg
    with FunctionGrader([M + "quarter"], workers=1) as g:
        assert g.grade(["abc"], REFS[:1]) == ([0.25], ["ok"])
        assert 0 < g.peak_rss_gb < 2


@pytest.mark.parametrize("stopping", [False, True], ids=["running", "stopping"])
def test_a_batch_whose_worker_dies_during_a_stop_is_graded_again_not_scored(tmp_path, stopping, capsys):
    """The reward function's worker killed while the process is stopping: the batch is graded again by a fresh
    worker, once (never scored 0 under on_error=zero); at any other time the death fails the batch, as before."""
    import os
    import signal

    from graft.signals import StopSignal

    f = tmp_path / "dies_once.py"
    f.write_text("import os\nfrom pathlib import Path\n\ndef score(prompts, completions, **columns):\n"
                 "    marker = Path(__file__).with_name('died')\n    if not marker.exists():\n"
                 "        marker.touch()\n        os._exit(3)\n    return [0.75] * len(completions)\n")
    with StopSignal() as stop, FunctionGrader([f"{f}:score"], timeout_s=10.0, workers=1, on_error="zero") as g:
        if stopping:
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.requested == "SIGTERM"
        out = g.grade(["abc"], REFS[:1])
    assert out == (([0.75], ["ok"]) if stopping else ([0.0], ["function_error"]))
