"""graft splits: held-out splits never share a problem
with the training task, and ``key=value`` overrides may follow the options (the commands in
configs/experiments/*.yaml do that)."""
import json
import os
import subprocess
import sys
from pathlib import Path

from graft.commands.cli import main
from graft.commands.splits import splits_main

REPO = Path(__file__).resolve().parents[1]
STUDY_BASE = REPO / "configs" / "experiments" / "base" / "default-until-2026-12-04.yaml"   # nine families, add among them


def _rows(folder: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (folder / f"{name}.jsonl").read_text().splitlines()]


def test_splits_are_disjoint_from_training_and_take_overrides_after_options(tmp_path):
    from graft.config import load_config
    from graft.data.datasets import load_prompts

    cfg = STUDY_BASE
    small, wide = tmp_path / "small", tmp_path / "wide"
    task = ["data.arithmetic.max_operand=6", "data.arithmetic.num_prompts=40"]
    sizes = ["--test", "12", "--hard", "12"]
    assert splits_main([str(cfg), "--out", str(small), *sizes, *task]) == 0
    assert splits_main([str(cfg), "--out", str(wide), *sizes, "data.arithmetic.max_operand=40"]) == 0
    train = {p.problem for p in load_prompts("arithmetic", "error", load_config(cfg, task).data.arithmetic)[0]}
    for name in ("test", "test_hard"):
        rows = _rows(small, name)
        assert len(rows) == 12 and not {r["problem"] for r in rows} & train
        assert len({r["problem"] for r in rows}) == 12                        # distinct
    assert _rows(small, "test") != _rows(wide, "test")                         # the override took effect
    # "What is 6 + 4?"-style problems with operands up to 6: every number in an `add` problem is <= 6
    adds = [r["problem"] for r in _rows(small, "test") if r["id"].startswith("test-add-")]
    assert adds and all(int(t.strip("?.")) <= 6 for p in adds for t in p.split() if t.strip("?.").isdigit())


def test_exclude_keeps_a_new_split_off_earlier_ones_and_refuses_a_bad_file(tmp_path, capsys):
    cfg = STUDY_BASE
    task = ["data.arithmetic.max_operand=6", "data.arithmetic.num_prompts=40"]
    first, second, same_seed = tmp_path / "first", tmp_path / "second", tmp_path / "same"
    sizes = ["--test", "12", "--hard", "12"]
    assert splits_main([str(cfg), "--out", str(first), *sizes, *task]) == 0
    assert splits_main([str(cfg), "--out", str(same_seed), *sizes, *task]) == 0
    earlier = ["--exclude", str(first / "test.jsonl"), "--exclude", str(first / "test_hard.jsonl")]
    assert splits_main([str(cfg), "--out", str(second), *sizes, *earlier, *task]) == 0
    old = {r["problem"] for name in ("test", "test_hard") for r in _rows(first, name)}
    for name in ("test", "test_hard"):
        assert _rows(same_seed, name) == _rows(first, name)                    # same seed, no exclude: same rows
        new = [r["problem"] for r in _rows(second, name)]
        assert len(set(new)) == 12 and not set(new) & old                     # same seed, excluded: none repeated
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n')
    assert splits_main([str(cfg), "--out", str(tmp_path / "x"), "--exclude", str(bad), *task]) == 2
    err = capsys.readouterr().err
    assert "--exclude" in err and "line 1" in err and "on_bad_row" not in err    # no switch to name here
    # operands up to 6 leave too few distinct problems of some family for 200 test prompts besides the 40
    # training ones -> one line, no traceback
    assert splits_main([str(cfg), "--out", str(tmp_path / "y"), "--test", "200", *task]) == 2
    assert "too few distinct problems" in capsys.readouterr().err


def test_splits_are_disjoint_from_each_other_and_by_computation_not_only_text(tmp_path):
    """issue 42: test and test_hard shared "What is 33 squared?"; and "What is 6 + 4?" vs "Compute $4 + 6$." is
    the same computation in other words. The key is the integers (any order) and the answer."""
    from graft.config import load_config
    from graft.data.arithmetic import problem_key
    from graft.data.datasets import load_prompts

    assert problem_key("What is 6 + 4?", 10) == problem_key("Compute $4 + 6$.", "10") == ((4, 6), "10")
    assert problem_key("What is 6 - 4?", 2) != problem_key("What is 6 + 4?", 10)
    assert problem_key("What is six plus four?", 10) == ("what is six plus four?",)     # no digits: the text
    cfg = STUDY_BASE
    task = ["data.arithmetic.max_operand=6", "data.arithmetic.num_prompts=40"]
    out = tmp_path / "s"
    assert splits_main([str(cfg), "--out", str(out), "--test", "24", "--hard", "24", "--hard-scale", "2", *task]) == 0
    keys = {n: {problem_key(r["problem"], r["answer"]) for r in _rows(out, n)} for n in ("test", "test_hard")}
    train = {problem_key(p.problem, p.answer)
             for p in load_prompts("arithmetic", "error", load_config(cfg, task).data.arithmetic)[0]}
    assert len(keys["test"]) == 24 and len(keys["test_hard"]) == 24
    assert not keys["test"] & keys["test_hard"] and not (keys["test"] | keys["test_hard"]) & train


def test_the_command_in_process_and_as_a_process_write_the_same_splits(tmp_path, capsys):
    """`graft splits` through the command table, and `python -m graft splits` (the commands recorded in
    configs/experiments/*.yaml) with the same options, write the same files."""
    cfg = str(STUDY_BASE)
    args = ["--test", "6", "--hard", "6", "--seed", "5", "data.arithmetic.max_operand=6", "data.arithmetic.num_prompts=40"]
    assert main(["splits", cfg, "--out", str(tmp_path / "cmd"), *args]) == 0
    assert f"{tmp_path / 'cmd' / 'test'}.jsonl: 6 prompts" in capsys.readouterr().out
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "graft", "splits", cfg, "--out", str(tmp_path / "process"), *args],
                          capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    for name in ("test", "test_hard"):
        assert _rows(tmp_path / "cmd", name) == _rows(tmp_path / "process", name)


def test_test_and_test_hard_never_share_a_prompt_even_when_their_ranges_overlap(tmp_path):
    """"What is 33 squared?" once landed in both test and test_hard. With --hard-scale 1 the two splits draw
    from the same operand range (the most overlap there can be), and still share no problem, by text or by key."""
    from graft.data.arithmetic import problem_key

    cfg = str(STUDY_BASE)
    out = tmp_path / "same_range"
    assert splits_main([cfg, "--out", str(out), "--test", "30", "--hard", "30", "--hard-scale", "1",
                        "data.arithmetic.max_operand=12", "data.arithmetic.num_prompts=40"]) == 0
    test, hard = _rows(out, "test"), _rows(out, "test_hard")
    assert not {r["problem"] for r in test} & {r["problem"] for r in hard}
    assert not {problem_key(r["problem"], r["answer"]) for r in test} & {problem_key(r["problem"], r["answer"]) for r in hard}
