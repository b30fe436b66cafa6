"""``-q``: errors and each command's final summary only (docs/commands.md, "How much a command says"), checked
command by command on one tiny two-model run: ``train`` as a process (what a user sees), the others in this process,
each run twice, without and with ``-q``."""
from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graft import console
from graft.commands.cli import main
from graft.config import save_config
from graft.trainer.loop import print_summary
from tests.patience import patient
from tests.trainer.helpers import tiny_config

REPO = Path(__file__).resolve().parents[1]


def _summary_text(run_dir: Path) -> str:
    """What ``train`` prints as its final summary: :func:`print_summary` of the run's ``summary.json``."""
    buf = io.StringIO()
    print_summary(json.loads((run_dir / "summary.json").read_text()), file=buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_llama_dir, tiny_gemma_dir):
    """A 2-step run trained by ``graft -q train`` in a child process: (run folder, its config file, the child's
    stdout, stderr and exit status, the summary it should have printed)."""
    tmp = tmp_path_factory.mktemp("quiet")
    cfg = tiny_config(tmp, tiny_llama_dir, tiny_gemma_dir, "checkpoint.save_every=1", "threads=1")
    path = tmp / "cfg.yaml"
    save_config(cfg, path)
    env = {k: v for k, v in os.environ.items() if k not in console.QUIET_ENV and k != "GRAFT_VERBOSITY"}
    p = subprocess.run([sys.executable, "-m", "graft.cli", "-q", "train", str(path)], capture_output=True, text=True,
                       cwd=tmp, env={**env, "PYTHONPATH": str(REPO)}, timeout=patient(600))
    run_dir = Path(cfg.run_dir)
    return run_dir, path, p.stdout, p.stderr, p.returncode, _summary_text(run_dir) if p.returncode == 0 else None


@pytest.fixture
def cli(monkeypatch, capsys):
    """``graft ARGV`` in this process: (exit status, stdout, stderr); the verbosity is put back afterwards."""
    monkeypatch.setattr(console, "_quiet_transformers", lambda: None)   # -q would quieten transformers for the session

    def call(*argv) -> tuple[int, str, str]:
        monkeypatch.setenv("GRAFT_VERBOSITY", "0")   # a -q call before must not reach this one through the environment
        capsys.readouterr()
        rc = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return rc, out, err

    yield call
    console.setup_logging(0)


def test_train_q_prints_its_run_summary_and_nothing_else(run):
    run_dir, _, out, err, rc, summary = run
    assert rc == 0, err
    assert out == "" and err == summary, err
    assert err.startswith("\n=== graft run summary ===\nrun dir: ") and f"final checkpoint: {run_dir}" in err


def test_train_q_drops_the_notices_and_step_lines_the_default_prints(run, cli):
    run_dir, path = run[:2]
    rc, out, err = cli("train", path, "resume=true", "steps=3")                    # the default: one more step
    assert rc == 0 and out == ""
    lines = err.splitlines()
    assert f"resumed from {run_dir / 'checkpoints' / 'step_000002'} at step 2" in lines      # a notice
    assert any(x.startswith("changed since the checkpoint") and x.endswith("steps 2 -> 3") for x in lines)  # a notice
    assert any(x.startswith("exchange: GRAFT") for x in lines) and any(x.startswith("step 3/3 | A: reward ") for x in lines)
    assert err.endswith(_summary_text(run_dir))
    rc, out, err = cli("-q", "train", path, "resume=true", "steps=4")              # the same, quiet
    assert rc == 0 and out == ""
    assert err == _summary_text(run_dir) and "steps: 4" in err


def test_q_errors_are_one_line(run, cli):
    rc, out, err = cli("-q", "train", run[1], "steps=5")     # the folder holds a run: refused before anything loads
    assert rc == 2 and out == ""
    assert err.startswith("error: run_dir: ") and "resume=true" in err and err.count("\n") == 1


def _grade_files(tmp: Path) -> list[str]:
    data, responses = tmp / "data.jsonl", tmp / "responses.jsonl"
    data.write_text(json.dumps({"id": "q1", "problem": "What is 6 * 8?", "answer": "48"}) + "\n")
    responses.write_text("".join(json.dumps({"id": "q1", "response": r}) + "\n" for r in ("\\boxed{48}", "\\boxed{47}")))
    return ["--responses", str(responses), "--data", str(data)]


# command -> (argv after `graft`, given the run folder, its config and a fresh folder; what the default writes on
# stderr and -q drops, or None; what -q keeps on stderr)
COMMANDS = {
    "config": (lambda r, c, t: ["config", "show", c, "exchange.mode=grpo"], "notice: exchange.mode=grpo is now", ""),
    "samples": (lambda r, c, t: ["samples", r, "-n", "4"], None, ""),
    "analyze": (lambda r, c, t: ["analyze", r], "written: ", ""),
    "report": (lambda r, c, t: ["report", r, "--out", t / "report"], None, ""),
    "store": (lambda r, c, t: ["store", "info", r / "trajectories"], None, ""),
    "export": (lambda r, c, t: ["export", r, "--model", "A", t / "export"], None, ""),
    "grade": (lambda r, c, t: ["grade", c, *_grade_files(t), "reward.workers=0"], None, ""),
    "grade --json": (lambda r, c, t: ["grade", c, *_grade_files(t), "--json", "reward.workers=0"], None,
                     "2 responses graded by math: mean reward 0.500, 1 rewarded;"),
    "sweep --print": (lambda r, c, t: ["sweep", c, "--grid", "seed=1,2", "--print"], None, ""),
    "splits": (lambda r, c, t: ["splits", REPO / "configs" / "default.yaml", "--out", t / "splits", "--test", "4",
                                "--hard", "4"], None, ""),
}


@pytest.mark.parametrize("name", COMMANDS)
def test_q_keeps_a_command_s_result_and_drops_the_rest(name, run, cli, tmp_path):
    make, dropped, kept = COMMANDS[name]
    run_dir, path = run[:2]
    (tmp_path / "d").mkdir()
    (tmp_path / "q").mkdir()
    rc, out, err = cli(*make(run_dir, path, tmp_path / "d"))
    assert rc == 0, err
    assert dropped is None or dropped in err, err
    rc, out_q, err_q = cli("-q", *make(run_dir, path, tmp_path / "q"))
    assert rc == 0, err_q
    assert out_q == out.replace(str(tmp_path / "d"), str(tmp_path / "q")) and out_q.strip()   # the result, unchanged
    assert err_q.startswith(kept) and (err_q.count("\n") == 1 if kept else err_q == ""), err_q


def test_q_turns_the_bars_off_and_say_follows_the_flags(monkeypatch, capsys):
    monkeypatch.setattr(console, "on_terminal", lambda: True)
    monkeypatch.setattr(console, "_quiet_transformers", lambda: None)
    try:
        for verbosity, bars, shown in ((-1, False, []), (0, True, ["resumed", "WARNING graft.test_quiet: w"]),
                                       (1, True, ["INFO graft.test_quiet: i", "resumed", "WARNING graft.test_quiet: w"])):
            console.setup_logging(verbosity)
            assert console.bars(True) is bars and console.quiet() is (verbosity < 0)
            logging.getLogger("graft.test_quiet").info("i")
            console.say("resumed")                                # a notice: as it is, no level or logger name
            logging.getLogger("graft.test_quiet").warning("w")
            assert capsys.readouterr().err.splitlines() == shown
    finally:
        console.setup_logging(0)
