"""The graft command: sweep expansion and one-line errors with a non-zero exit on bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graft import cli
from graft.cli import main, sweep_commands

REPO = Path(__file__).resolve().parents[1]


def test_sweep_expands_the_grid_into_separate_run_dirs(tmp_path):
    cfg = REPO / "configs" / "default.yaml"
    cmds = sweep_commands(str(cfg), ["exchange.delta=0.6,0.8", "update.order=peer_last,peer_first"], ["steps=2"])
    assert len(cmds) == 4
    tails = [c[c.index("train") + 1:] for c in cmds]
    assert tails[0] == [str(cfg), "steps=2", "exchange.delta=0.6", "update.order=peer_last", "run_dir=runs/default/delta-0.6_order-peer_last"]
    assert len({t[-1] for t in tails}) == 4


def test_sweep_print_does_not_run(tmp_path, capsys):
    assert main(["sweep", str(REPO / "configs" / "default.yaml"), "--grid", "exchange.delta=0.5,0.9", "--print"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 2 and all("graft.cli train" in l for l in out)


def test_bad_grid_value_is_a_clear_error(capsys):
    assert main(["sweep", str(REPO / "configs" / "default.yaml"), "--grid", "exchange.delta=0.5,oops", "--print"]) == 2
    assert "error:" in capsys.readouterr().err


def _train(tmp_path, *overrides):
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "graft.cli", "train", str(REPO / "configs" / "default.yaml"),
                           f"run_dir={run_dir}", "progress=false", *overrides],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    return proc, run_dir


def test_malformed_jsonl_exits_with_a_clear_message_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "problem": "1+1", "answer": "2"}) + "\n{not json\n")
    proc, run_dir = _train(tmp_path, f"data.train={bad}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error:") and "bad.jsonl" in proc.stderr and "line 2" in proc.stderr
    assert not run_dir.exists()


def test_unknown_model_path_exits_with_a_clear_message_and_writes_nothing(tmp_path):
    proc, run_dir = _train(tmp_path, f"models.0.path={tmp_path / 'nope'}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error:") and "nope" in proc.stderr
    assert "Traceback" not in proc.stderr and not run_dir.exists()


def test_a_broken_pipe_that_is_not_stdouts_is_not_taken_for_a_closed_reader(monkeypatch, tmp_path):
    """A BrokenPipeError from another pipe (a dead worker's) while stdout is a healthy file is a real error: it
    propagates instead of ending the command with SIGPIPE's quiet 141."""
    def dispatch(cmd, argv):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "_dispatch", dispatch)
    with open(tmp_path / "out.txt", "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        with pytest.raises(BrokenPipeError):
            cli.main(["config", "show"])


def test_stdout_reader_gone_sees_a_closed_pipe_and_only_that():
    r, w = os.pipe()
    with os.fdopen(w, "w") as wf:
        saved = sys.stdout
        try:
            sys.stdout = wf
            assert not cli._stdout_reader_gone()   # reader still open
            os.close(r)
            assert cli._stdout_reader_gone()       # reader closed: POLLERR on the write end
        finally:
            sys.stdout = saved


def test_a_reader_that_closes_early_ends_the_command_quietly():
    """`graft config show ... | head -1`: the pipe closes before the output is written; the command exits with
    SIGPIPE's status (141) and no traceback, on stdout's explicit flush or a print that fills the buffer."""
    p = subprocess.Popen([sys.executable, "-m", "graft.cli", "config", "show", "configs/default.yaml"], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()   # before the child has imported anything: every write it makes meets a closed pipe
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
