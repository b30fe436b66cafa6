"""``graft samples``: which responses it finds, how it draws them, and its one-line refusals."""
import json

import pytest

from graft.commands.cli import main
from graft.data.datasets import RowIds
from graft.domains.math import MATH
from graft.evaluation.samples import (Sample, SamplesError, collect, format_sample, parse_steps, pick, pick_mixed)
from graft.storage.trajectory_store import TrajectoryStore
from tests.evaluation.conftest import _group, make_run


def _s(i, reward=1.0, problem="What is 2 + 3?", response="2 + 3 = 5. \\boxed{5}"):
    return Sample("train", "A", None, i, None, f"p{i}", problem, "5", response, reward)


def test_pick_is_seeded_order_keeping_and_takes_all_when_short():
    xs = [_s(i) for i in range(50)]
    a, b = pick(xs, 5, seed=3), pick(xs, 5, seed=3)
    assert a == b and len(a) == 5
    assert [s.step for s in a] == sorted(s.step for s in a)          # given order kept
    assert pick(xs, 5, seed=4) != a                                  # another seed, another draw
    assert pick(xs[:3], 10, seed=0) == xs[:3] and pick(xs, 0, seed=0) == []


def test_a_mixed_pick_is_half_rewarded_and_fills_from_the_other_kind():
    xs = [_s(i, reward=1.0 if i % 10 == 0 else 0.0) for i in range(100)]     # 10 rewarded (i = 0, 10, ...), 90 not
    a = pick_mixed(xs, 12, seed=3, threshold=0.5)
    assert a == pick_mixed(xs, 12, seed=3, threshold=0.5) and [s.step for s in a] == sorted(s.step for s in a)
    assert sum(s.reward for s in a) == 6 and len(a) == 12                      # 12 / 2 = 6 of each kind
    assert sum(s.reward for s in pick_mixed(xs, 5, seed=0, threshold=0.5)) == 3                # odd n: the rewarded half rounded up
    few = xs[:21]                                                               # rewarded: 0, 10, 20; 18 not
    assert sum(s.reward for s in pick_mixed(few, 12, seed=0, threshold=0.5)) == 3              # all 3 rewarded, 9 unrewarded fill in
    assert sum(s.reward for s in pick_mixed(few[1:10] + few[:1], 12, seed=0, threshold=0.5)) == 1   # 1 + 9: fewer than n, all of them
    assert len(pick_mixed(few[1:10] + few[:1], 12, seed=0, threshold=0.5)) == 10
    none = [_s(i, reward=0.0) for i in range(30)]                               # nothing rewarded: 12 failures shown
    assert len(pick_mixed(none, 12, seed=0, threshold=0.5)) == 12 and pick_mixed([], 12, seed=0, threshold=0.5) == []
    assert pick_mixed(xs, 0, seed=0, threshold=0.5) == []


@pytest.mark.parametrize("text,want", [(None, None), ("7", (7, 7)), ("13-18", (13, 18))])
def test_parse_steps(text, want):
    assert parse_steps(text) == want


@pytest.mark.parametrize("text", ["x", "3-1", "0", "2-y"])
def test_parse_steps_refuses(text):
    with pytest.raises(SamplesError, match="--steps"):
        parse_steps(text)


def test_train_rows_by_writer_reward_and_steps(tmp_path):
    run = make_run(tmp_path / "run")
    # conftest STORE (G = 2): A rewarded at step 1 on p2 [1, 0] and p4 [1, 1], at step 2 on p3 [1, 0] -> 3 + 1 = 4;
    # B rewarded at step 1 on p1 [1, 0], at step 2 on p2 [1, 0] -> 2; 6 rewarded of 2 * (8 + 6) = 28 rows
    assert len(collect(run, "train", "A", None, "1", 0.5)) == 4
    assert [(s.step, s.prompt_id) for s in collect(run, "train", "A", (2, 2), "1", 0.5)] == [(2, "p3")]
    assert len(collect(run, "train", None, None, "1", 0.5)) == 6
    assert len(collect(run, "train", None, None, "0", 0.5)) == 22 and len(collect(run, "train", None, None, "any", 0.5)) == 28
    assert all(s.source == "train" and s.receiver is None for s in collect(run, "train", "B", None, "1", 0.5))


def test_peer_rows_are_the_admitted_ones_per_receiver(tmp_path):
    st = TrajectoryStore(tmp_path / "run" / "trajectories", run_id="t")
    g = _group("A", "p1", [1, 0, 1], step=1)
    # A's responses 0 and 2 were offered to B: 0 admitted, 2 gated out; response 1 was offered to C and admitted
    use = {("A", "p1", 0): [("B", True, 0.9)], ("A", "p1", 2): [("B", False, 0.0)], ("A", "p1", 1): [("C", True, 1.0)]}
    st.write_step(1, 0, [g], {"A": "tokA"}, use)
    into_b = collect(tmp_path / "run", "peer", "B", None, "any", 0.5)
    assert [(s.writer, s.receiver, s.response, s.reward) for s in into_b] == [("A", "B", "r0", 1.0)]
    assert [(s.receiver, s.reward) for s in collect(tmp_path / "run", "peer", None, None, "any", 0.5)] == \
        [("B", 1.0), ("C", 0.0)]
    assert collect(tmp_path / "run", "peer", "C", None, "1", 0.5) == []


def _eval_run(root):
    out = root / "eval_final" / "gemma3"
    (out / "test").mkdir(parents=True)
    (out / "results.json").write_text("{}")
    kept = {"statuses": ["ok"] * 2, "finished": [True] * 2, "num_tokens": [9] * 2}   # graft eval's other fields
    rows = [{"id": "t-max-1", "answer": "228", "rewards": [1.0, 0.0],
             "responses": ["\\boxed{117} or \\boxed{228}", "\\boxed{117}"], **kept},
            {"id": "t-add-2", "answer": "5", "rewards": [1.0, 1.0], "responses": ["2 + 3 = 5 \\boxed{5}"] * 2, **kept}]
    (out / "test" / "repeat_0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = root / "test.jsonl"
    data.write_text(json.dumps({"id": "t-max-1", "problem": "Which number is larger: 117 or 228?", "answer": "228"})
                    + "\n")
    return root, data


def test_eval_rows_join_question_text_and_carry_monitor_flags(tmp_path):
    run, data = _eval_run(tmp_path / "run")
    got = collect(run, "eval", None, None, "1", 0.5, [str(data)])
    assert [(s.prompt_id, s.dataset) for s in got] == [("t-max-1", "test"), ("t-add-2", "test"), ("t-add-2", "test")]
    hedge = got[0]
    # two boxes; the last holds 228, a number of the question -> multi_box and operand
    assert hedge.flags(MATH) == ["operand", "multi_box"]
    assert got[1].problem is None and got[1].flags(MATH) == []     # not in --data: no question, no flags
    text = format_sample(hedge, MATH, width=20)     # cut to 19 characters + "…"
    assert text.splitlines() == ["-- test · gemma3 · t-max-1 · answer 228 · reward 1 · flags: operand, multi_box",
                                 "Q: Which number is lar…", "A: \\boxed{117} or \\box…"]
    # a `graft eval` output folder given directly
    assert len(collect(run / "eval_final" / "gemma3", "eval", None, None, "0", 0.5)) == 1


def test_eval_rows_join_a_trl_file_without_ids_or_answers(tmp_path):
    run, _ = _eval_run(tmp_path / "run")
    row = {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Which is larger?"}],
           "level": 2}                                 # no id (derived: the same as the evaluation's), no answer
    data = tmp_path / "trl.jsonl"
    data.write_text(json.dumps(row) + "\n")
    rid = RowIds()(row)
    records = run / "eval_final" / "gemma3" / "test" / "repeat_0.jsonl"
    records.write_text(records.read_text().replace("t-max-1", rid))
    got = collect(run, "eval", None, None, "1", 0.5, [str(data)])
    assert got[0].prompt_id == rid and got[0].problem == "Which is larger?"     # the last user message


def test_cli_prints_a_header_and_the_picked_samples(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    assert main(["samples", str(run), "--model", "A", "-n", "2", "--steps", "1-2", "--reward", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "2 of 4 rewarded training rollouts of A, steps 1-2 (seed 0)"
    assert sum(line.startswith("-- step ") for line in out) == 2 and len(out) == 7
    assert main(["samples", str(run), "-n", "1", "--json", "--reward", "0"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["reward"] == 0.0 and row["source"] == "train" and "flags" in row


def test_cli_shows_rewarded_and_unrewarded_rollouts_by_default(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    # conftest STORE: A wrote 14 responses, 4 rewarded (step 1: p2 [1, 0], p4 [1, 1]; step 2: p3 [1, 0]), 10 not
    assert main(["samples", str(run), "--model", "A", "-n", "6"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "6 of 14 training rollouts of A: 3 of 4 rewarded, 3 of 10 not (seed 0)"
    rewards = [line.rsplit("reward ", 1)[1] for line in out if line.startswith("-- step ")]
    assert sorted(rewards) == ["0", "0", "0", "1", "1", "1"]
    assert main(["samples", str(run), "--model", "A", "-n", "12", "--json"]) == 0     # 4 rewarded + 8 of the 10 others
    assert sorted(json.loads(line)["reward"] for line in capsys.readouterr().out.splitlines()) == [0.0] * 8 + [1.0] * 4
    # B at step 2 wrote one rewarded response of 6 (p2 [1, 0]); with --reward 1 only that one, by default all six
    assert main(["samples", str(run), "--model", "B", "--steps", "2", "--reward", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "1 of 1 rewarded training rollouts of B, steps 2 (seed 0)"
    assert main(["samples", str(run), "--model", "B", "--steps", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "6 of 6 training rollouts of B, steps 2: 1 of 1 rewarded, 5 of 5 not (seed 0)"


@pytest.mark.parametrize("args,msg", [
    (["--from", "eval"], "no evaluation of any model under"),
    (["--steps", "5-9"], "no stored step of"),
    (["--steps", "1-x"], "--steps '1-x'"),
    (["--from", "eval", "--steps", "1"], None),
    (["-n", "-1"], "-n must be >= 0"),
])
def test_cli_refuses_in_one_line(tmp_path, capsys, args, msg):
    run = make_run(tmp_path / "run")
    if msg is None:
        _eval_run(run)
        msg = "--steps applies to training rows"
    assert main(["samples", str(run), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and msg in err and err.count("\n") == 1


def test_cli_refuses_a_recorded_run_without_store_and_a_torn_eval_row(tmp_path, capsys):
    run, _ = _eval_run(tmp_path / "run")
    assert main(["samples", str(run)]) == 2
    assert "no trajectory store under" in capsys.readouterr().err
    with open(run / "eval_final" / "gemma3" / "test" / "repeat_0.jsonl", "a") as f:
        f.write('{"id": "t-x", "answer": "1"}\n')
    assert main(["samples", str(run), "--from", "eval"]) == 2
    err = capsys.readouterr().err
    assert "repeat_0.jsonl:3: not an eval response row" in err and err.count("\n") == 1


def test_a_program_keeps_its_lines_and_indentation():
    from graft.domains.code import CODE
    program = "```python\ndef f(xs):\n    return [x for x in xs if x % 2 == 0]\n```\n"
    reference = json.dumps({"tests": ["assert f([1, 2]) == [2]"], "entry_point": "f"})
    s = Sample("train", "A", None, 1, None, "p1", "Write f.", reference, program, 1.0)
    assert format_sample(s, CODE).splitlines()[2:] == [
        "A: ```python", "   def f(xs):", "       return [x for x in xs if x % 2 == 0]", "   ```"]
    # cut at width characters (13 = "```python\ndef" less one, then "…"), the lines still kept
    assert format_sample(s, CODE, width=14).splitlines()[2:] == ["A: ```python", "   def…"]
    assert format_sample(s, MATH).splitlines()[2] == "A: ```python def f(xs): return [x for x in xs if x % 2 == 0] ```"
    # the header shows the reference (the tests' JSON) on one line, cut at 60 characters (59 + "…")
    long = Sample("train", "A", None, 1, None, "p1", "Write f.", json.dumps({"tests": ["assert f([1]) == []"] * 20}),
                  program, 1.0)
    head = format_sample(long, CODE).splitlines()[0]
    assert head == "-- step 1 · A · p1 · answer " + long.answer[:59] + "… · reward 1"


def test_the_verifiers_status_reaches_the_samples_and_sets_the_status_flags(tmp_path):
    from graft.domains.code import CODE
    run = make_run(tmp_path / "run")
    assert {s.status for s in collect(run, "train", None, None, "any", 0.5)} == {"ok"}   # the store's verify_status
    reference = json.dumps({"tests": ["assert f(1) == 2"], "entry_point": "f", "holdout": ["assert f(50) == 100"]})
    program = "```python\ndef f(x):\n    return 2 * x if x < 10 else 0\n```"
    held = Sample("train", "A", None, 1, None, "p1", "Write f.", reference, program, 1.0, "holdout_fail")
    assert held.flags(CODE) == ["holdout_fail"]
    assert Sample("train", "A", None, 1, None, "p1", "Write f.", reference, program, 1.0, "ok").flags(CODE) == []
