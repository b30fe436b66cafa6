"""`graft bench MEASUREMENT`: every measurement answers --help without torch, refuses bad input in one line, and runs
end to end on the tiny models (train-step with real `graft train` processes)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from graft.bench import train_step
from graft.bench.args import MEASUREMENTS, bench_parser
from graft.commands.cli import main
from graft.config import ConfigError
from tests.patience import patient

REPO = Path(__file__).resolve().parents[1]


def _tiny(tmp_path, llama, gemma, *extra):
    """Overrides that make the default config a 2-model run of the tiny random models on 4 prompts x 4 samples."""
    models = f"models=[{{name: A, path: '{llama}', template: plain, lr: 1.0e-3}}, {{name: B, path: '{gemma}', template: plain, lr: 1.0e-3}}]"
    return [models, "batch_prompts=4", "rollout.n=4", "rollout.max_new_tokens=6", "rollout.batch_size=16", "threads=1",
            "data.arithmetic.num_prompts=16", "data.shuffle=false", "reward.workers=0", "update.num_minibatches=2",
            "update.micro_batch_size=8", *extra]


@pytest.mark.parametrize("name", [None, *MEASUREMENTS])
def test_help_is_answered_by_the_parser_alone(name):
    """`graft bench [NAME] --help` prints that measurement's usage and loads neither torch nor the trainer."""
    argv = ["bench", *([name] if name else []), "--help"]
    code = ("import sys; from graft.commands.cli import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
            "print(sorted({'torch', 'graft.trainer.loop'} & set(sys.modules)))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=patient(120))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"usage: graft bench{' ' + name if name else ''} ")
    assert p.stdout.strip().endswith("[]")


def test_a_measurement_name_first_selects_its_parser():
    assert bench_parser().parse_args(["--only", "a", "rollout.temperature=0.7"]).measurement is None
    args = bench_parser().parse_args(["rollout-batch", "--sizes", "4,8", "threads=1"])
    assert (args.measurement, args.sizes, args.overrides) == ("rollout-batch", "4,8", ["threads=1"])
    assert bench_parser().parse_args(["train-step", "--recipe", "a=1", "--recipe", "b=2"]).recipe == ["a=1", "b=2"]
    assert set(bench_parser().subcommands()) == set(MEASUREMENTS)


def test_gpu_check_does_not_load_the_trainer():
    """scripts/gpu_check.sh runs on a bare GPU machine: no trainer file outputs, so no pyarrow."""
    code = "import sys, graft.bench.gpu_check; print(sorted({'pyarrow', 'graft.trainer.loop'} & set(sys.modules)))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=patient(120))
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


@pytest.mark.parametrize("argv, words", [
    (["rollout-batch", "--sizes", "64,x"], "--sizes"),
    (["rollout-batch", "--sizes", "64,64"], "distinct"),
    (["rollout-phase", "--reps", "0"], "--reps"),
    (["rollout-phase", "--compare", "nope"], "invalid choice"),
    (["update-precision", "--config", "/nonexistent.yaml"], "not found"),
    (["train-step"], "--old CHECKOUT and/or --recipe"),
    (["train-step", "--old", "/nonexistent"], "no graft package"),
    (["train-step", "--recipe", "threads=1", "--steps", "1"], "--steps"),
    (["code-grading", "--rows", "0"], "--rows"),
    (["code-grading", "--old", "/nonexistent"], "no graft package"),
])
def test_bad_input_is_one_error_line(argv, words, capsys):
    try:
        rc = main(["bench", *argv])
    except SystemExit as e:   # argparse's own refusal: the usage line, then one error line
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and words in err[-1]
    assert err[-1].startswith("error:") and len(err) == 1 or err[-1].startswith("graft bench") and "usage:" in err[0]


def test_train_step_sides():
    ns = lambda **kw: SimpleNamespace(**({"old": None, "new": str(REPO), "recipe": []} | kw))  # noqa: E731
    assert list(train_step.sides(ns(old=str(REPO)))) == ["old", "new"]
    got = train_step.sides(ns(recipe=["a=1", "b=2"]))
    assert list(got) == ["new", "recipe"] and got["recipe"] == (REPO, ["a=1", "b=2"]) and got["new"][1] == []
    with pytest.raises(ConfigError, match="--old CHECKOUT"):
        train_step.sides(ns())


def test_train_step_table_hand_worked():
    """Ratios are the first side's over each other's for seconds, the other's over the first's for tokens/s."""
    fields = dict.fromkeys(train_step.FIELDS, 1.0) | dict.fromkeys(train_step.RATES, None)
    med = {"old": {"steps_2_on": fields | {"step_s": 60.0, "gen_tok_per_s": 100.0},
                   "step_1": fields | {"step_s": 80.0}, "wall_s": 300.0},
           "new": {"steps_2_on": fields | {"step_s": 40.0, "gen_tok_per_s": 150.0},
                   "step_1": fields | {"step_s": 40.0}, "wall_s": 200.0}}
    lines = train_step.table(med, 4, 100.0)
    assert lines[0] == "| medians | old | new | old / new |"
    assert "| step_s (steps 2..4) | 60.0 | 40.0 | 1.50x |" in lines         # 60 / 40
    assert "| gen_tok_per_s (steps 2..4) | 100.0 | 150.0 | 1.50x |" in lines  # 150 / 100
    assert "| step_s (step 1) | 80.0 | 40.0 | 2.00x |" in lines
    assert "| process wall s | 300 | 200 | 1.50x |" in lines
    assert "| rollout_gflops (steps 2..4) | – | – | |" in lines


# ----------------------------------------------------------------------------- end to end (tiny models)

@pytest.mark.slow
def test_rollout_phase_prefix_and_claim(tmp_path, tiny_llama_dir, tiny_gemma_dir, capsys):
    for compare, a, b in (("prefix", "prefix off", "prefix on"), ("claim", "in turn", "side by side")):
        out = tmp_path / f"{compare}.json"
        argv = ["rollout-phase", "--compare", compare, "--reps", "2", "--out", str(out)]
        assert main(["bench", *argv, *_tiny(tmp_path, tiny_llama_dir, tiny_gemma_dir)]) == 0
        res = json.loads(out.read_text())
        assert list(res["seconds"]) == [a, b] and all(len(v) == 2 and min(v) > 0 for v in res["seconds"].values())
        same, total = res["same_responses"]
        assert total == 2 * 4 * 4 and 0 <= same <= total         # 2 models x 4 prompts x 4 samples
        assert res["tokens"][a][0] > 0
        assert res["tokens"][a][0] == res["tokens"][a][1]         # the same side repeats its samples exactly
        assert f"{a} / {b} (medians)" in capsys.readouterr().out


@pytest.mark.slow
def test_rollout_batch_sizes(tmp_path, tiny_llama_dir, tiny_gemma_dir, capsys):
    out = tmp_path / "batch.json"
    argv = ["rollout-batch", "--sizes", "16,4", "--reps", "2", "--out", str(out)]
    assert main(["bench", *argv, *_tiny(tmp_path, tiny_llama_dir, tiny_gemma_dir)]) == 0
    raw = json.loads(out.read_text())["raw"]
    assert set(raw) == {"A", "B"} and all(list(by) == ["16", "4"] for by in raw.values())
    for by_size in raw.values():
        first = by_size["16"]
        assert [r["same_as_first_size"] for r in first] == [16, 16]   # batch 16 repeats its own responses
        assert all(r["responses"] == 16 and r["generated"] > 0 for rows in by_size.values() for r in rows)
    assert "| A | 4 |" in capsys.readouterr().out


@pytest.mark.slow
def test_update_precision_repeats_the_same_update(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch, capsys):
    from tests.trainer.helpers import crafted_rewards

    crafted_rewards(monkeypatch)   # mixed groups: every update has work
    out = tmp_path / "precision.json"
    argv = ["update-precision", "--reps", "2", "--out", str(out)]
    assert main(["bench", *argv, *_tiny(tmp_path, tiny_llama_dir, tiny_gemma_dir)]) == 0
    raw = json.loads(out.read_text())["raw"]
    for model in ("A", "B"):
        fp32, bf16 = raw["fp32"][model], raw["bf16"][model]
        assert fp32[0]["tokens/update"] == fp32[1]["tokens/update"] == bf16[0]["tokens/update"] > 0
        assert fp32[0]["loss"] == fp32[1]["loss"]           # equal work: weights and optimiser restored before each
        assert fp32[0]["ratio/mean"] == fp32[1]["ratio/mean"] and bf16[0]["loss"] == bf16[1]["loss"]
        for row in (fp32[0], bf16[0]):   # behaviour log-probs recomputed in the precision under test: ratios near 1
            assert row["ratio/mean"] == pytest.approx(1.0, abs=0.05)
    assert "| A |" in capsys.readouterr().out


@pytest.mark.slow
def test_train_step_runs_graft_train_per_side(tmp_path, tiny_llama_dir, tiny_gemma_dir, capsys):
    """Two checkouts (here the same one) and a recipe that changes no number: every side trains on the same samples."""
    out = tmp_path / "steps.json"
    argv = ["train-step", "--old", str(REPO), "--new", str(REPO), "--recipe", "checkpoint.keep_last=1",
            "--steps", "2", "--reps", "1", "--out", str(out), *_tiny(tmp_path, tiny_llama_dir, tiny_gemma_dir)]
    assert main(["bench", *argv]) == 0
    res = json.loads(out.read_text())
    assert list(res["raw"]) == ["old", "new", "recipe"] and res["matmul_peak_gflops"] > 0
    tokens = {side: [s["tokens_generated"] for s in runs[0]["steps"]] for side, runs in res["raw"].items()}
    assert tokens["old"] == tokens["new"] == tokens["recipe"] and len(tokens["old"]) == 2 and min(tokens["old"]) > 0
    for runs in res["raw"].values():
        assert runs[0]["module"] == str(REPO / "graft" / "__init__.py")
        step = runs[0]["steps"][1]
        assert step["step_gflops"] > 0 and step["kept"]["A/tokens/prompt"] > 0   # the FLOP model's counts are there
        assert step["step_s"] >= step["rollout_s"] and step["gen_tok_per_s"] > 0
    assert res["medians"]["new"]["steps_2_on"]["step_s"] == res["raw"]["new"][0]["steps"][1]["step_s"]
    assert "| medians | old | new | recipe | old / new | old / recipe |" in capsys.readouterr().out


@pytest.mark.slow
def test_rollout_profile_splits_every_phase(tmp_path, tiny_llama_dir, tiny_gemma_dir, capsys):
    from graft.bench.rollout_profile import PARTS, PHASES
    from graft.config import load_config, save_config

    save_config(load_config(None, _tiny(tmp_path, tiny_llama_dir, tiny_gemma_dir)), tmp_path / "tiny.yaml")
    out = tmp_path / "profile"
    argv = ["rollout-profile", "--config", str(tmp_path / "tiny.yaml"), "--prompts", "2", "--n", "2",
            "--max-new-tokens", "4", "--out", str(out)]
    assert main(["bench", *argv]) == 0
    res = json.loads((out / "profile.json").read_text())
    assert set(res["models"]) == {tiny_llama_dir, tiny_gemma_dir}
    for m in res["models"].values():
        for phase in PHASES:
            r = m[phase]
            assert set(r["seconds"]) == set(PARTS) and sum(r["share"].values()) == pytest.approx(1.0, abs=1e-6)
    assert capsys.readouterr().out.strip() == (out / "profile.md").read_text().strip()


def test_code_grading_times_every_side_on_its_own_checkout(tmp_path, capsys):
    """Two sides on this checkout: each repetition grades every row's correct and wrong program, side by side."""
    from graft.reward import sandbox

    if not sandbox._probe("bwrap")[0]:
        pytest.skip(f"the code domain needs bwrap: {sandbox._probe('bwrap')[1]}")
    out = tmp_path / "grading.json"
    assert main(["bench", "code-grading", "--old", str(REPO), "--rows", "3", "--reps", "2", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert list(res["raw"]) == ["old", "new"] and all(len(rs) == 2 for rs in res["raw"].values())
    for rs in res["raw"].values():
        for r in rs:
            assert r["module"] == str(REPO / "graft" / "__init__.py") and r["isolation"] == "bwrap"
            assert r["correct"] > 0 and r["wrong"] > 0 and r["tests_per_row"] >= 1
    printed = capsys.readouterr().out
    assert "| old | `" in printed and "| new | `" in printed and " 1.00x | 1.00x |" in printed   # old is the first


def test_train_step_refuses_a_bad_recipe_before_any_run(capsys):
    assert main(["bench", "train-step", "--recipe", "exchange.gate=0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "exchange.gate" in err[0]


def test_train_step_stops_in_one_line_when_a_side_fails(tmp_path, capsys):
    (tmp_path / "fake" / "graft").mkdir(parents=True)
    (tmp_path / "fake" / "graft" / "__init__.py").write_text("")   # a graft without graft.cli: its run fails
    assert main(["bench", "train-step", "--old", str(tmp_path / "fake"), "--steps", "2", "--reps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: graft train on ") and str(tmp_path / "fake") in err[-1] and "exited 1" in err[-1]
