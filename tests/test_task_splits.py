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
    train = {p.problem for p in load_prompts("arithmetic", "error", load_config(cfg, task).data.tasks)[0]}
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
    assert problem_key("What is six plus four?", 10) == ((4, 6), "10")                  # number words are numbers
    assert problem_key("What is the capital of France?", "Paris") == ("what is the capital of france?",)   # no number
    cfg = STUDY_BASE
    task = ["data.arithmetic.max_operand=6", "data.arithmetic.num_prompts=40"]
    out = tmp_path / "s"
    assert splits_main([str(cfg), "--out", str(out), "--test", "24", "--hard", "24", "--hard-scale", "2", *task]) == 0
    keys = {n: {problem_key(r["problem"], r["answer"]) for r in _rows(out, n)} for n in ("test", "test_hard")}
    train = {problem_key(p.problem, p.answer)
             for p in load_prompts("arithmetic", "error", load_config(cfg, task).data.tasks)[0]}
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


def test_the_key_is_the_computation_in_any_wording():
    """One computation, every wording the task's families use: digits or words, any order, an operand the wording
    implies written out (a squared = a x a, twice a = 2 x a, right after a = a + 1)."""
    from graft.data.arithmetic import problem_key

    assert problem_key("What is 13 * 14?", 182) == problem_key("Compute $14 \\times 13$.", "182") == problem_key(
        "There are 13 bags with 14 apples in each bag. How many apples are there in total?", 182) == ((13, 14), "182")
    assert problem_key("What is nine plus zero?", 9) == problem_key("What is zero plus nine?", 9) == problem_key(
        "What is 0 + 9?", 9) == ((0, 9), "9")
    assert problem_key("What is eleven plus six?", 17) == problem_key("Compute $6 + 11$.", 17)
    assert problem_key("What is forty-seven plus three hundred five?", 352) == ((47, 305), "352")
    assert problem_key("What is 17 squared?", 289) == problem_key("Compute $17 \\times 17$.", 289) == ((17, 17), "289")
    assert problem_key("What is twice 7?", 14) == problem_key("What is 7 * 2?", 14) == ((2, 7), "14")
    assert problem_key("What number comes right after 41?", 42) == problem_key("What is 41 + 1?", 42)
    # other operands or another answer: another computation ("someone" holds no "one")
    assert problem_key("What is 13 * 15?", 195) != problem_key("What is 13 * 14?", 182)
    assert problem_key("What is 19 + 17 - 13?", 23) != problem_key("What is 13 + 17 - 19?", 11)
    assert problem_key("Someone has 3 pens and finds 4 more.", 7) == ((3, 4), "7")


def test_the_confirmation_split_command_run_today_repeats_no_earlier_computation(tmp_path):
    """The confirmation's committed splits (results/confirm/data, written on 2026-12-03 before splits were kept apart by
    computation) repeat 8 computations of training or the study's held-out prompts (e.g. test-latex-00003,
    "Compute $13 \\times 14$.", the study's "What is 14 * 13?"; tests/test_writeup_figures.py lists them). The same
    command today, --exclude and all, writes splits that repeat none, of training, of the study's splits or of each
    other."""
    from graft.config import load_config
    from graft.data.arithmetic import problem_key
    from graft.data.datasets import load_prompts

    study = [REPO / "results" / "study" / "data" / f"{n}.jsonl" for n in ("test", "test_hard")]
    out = tmp_path / "confirm"
    assert splits_main([str(STUDY_BASE), "--out", str(out), "--test", "48", "--hard", "48", "--seed", "3031",
                        *[a for f in study for a in ("--exclude", str(f))]]) == 0
    key = lambda r: problem_key(r["problem"], r["answer"])  # noqa: E731
    earlier = {problem_key(p.problem, p.answer) for p in load_prompts("arithmetic", "error", load_config(STUDY_BASE).data.tasks)[0]}
    earlier |= {key(json.loads(x)) for f in study for x in f.read_text().splitlines()}
    new = [key(r) for n in ("test", "test_hard") for r in _rows(out, n)]
    assert len(new) == 96 and len(set(new)) == 96 and not set(new) & earlier
    committed = [key(r) for n in ("test", "test_hard") for r in _rows(REPO / "results" / "confirm" / "data", n)]
    assert sum(k in earlier for k in committed) == 8                         # what the committed files carry
