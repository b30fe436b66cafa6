"""The graft command: sweep expansion and one-line errors with a non-zero exit on bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graft.commands import cli
from graft.commands.cli import main, sweep_commands
from tests.patience import patient

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
                          capture_output=True, text=True, timeout=patient(300), cwd=REPO)
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
    assert p.wait(timeout=patient(120)) == 141, err
    assert "Traceback" not in err and "Exception ignored" not in err, err


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["config", "show", "--help"]])
def test_help_to_a_closed_pipe_is_no_traceback(argv):
    """issue 38: `graft --help | head -1` (the reader gone before the usage is written) ends quietly, as
    `graft config show ... | head -1` does, instead of with a BrokenPipeError traceback."""
    p = subprocess.Popen([sys.executable, "-m", "graft.cli", *argv], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=patient(120)) in (0, 141), err
    assert err == "", err


def test_version_is_printed_and_defined_once(capsys):
    """issue 38: `graft --version` prints graft.__version__, the one place the version is written (pyproject.toml
    reads it from there)."""
    import graft

    tomllib = pytest.importorskip("tomllib")

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"graft {graft.__version__}\n"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]


def test_a_mistyped_command_gets_the_nearest_one(capsys):
    assert main(["trian"]) == 2
    assert capsys.readouterr().err == "error: unknown command 'trian'; did you mean 'train'?\n"
    assert main(["xyz"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown command 'xyz'; commands: train, eval") and "did you mean" not in err


def test_config_show_on_a_folder_says_it_is_reading_a_folder(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("steps: 1\n")
    assert main(["config", "show", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path}: is a folder, not a config file "
                                       f"(did you mean {tmp_path / 'config.yaml'}?)\n")


def test_config_that_is_not_utf8_is_one_line_naming_the_file(tmp_path, capsys):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("steps: 3  # caf\u00e9\n".encode("latin-1"))
    assert main(["config", "show", str(bad)]) == 2
    assert capsys.readouterr().err == f"error: {bad}: not UTF-8 text (byte 0xe9 at offset 15); save it as UTF-8\n"


def test_report_out_naming_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "afile")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'afile'}: is a file; the report needs a folder (--out DIR)\n"


@pytest.mark.parametrize("argv", [["analyze", "{tmp}/nope"], ["eval", "--model", "x", "--data", "aime24", "--data-dir", "{tmp}"]])
def test_every_command_starts_its_error_with_the_same_prefix(argv, tmp_path, capsys):
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err


def _installed_as(monkeypatch, root: Path, checkout: bool) -> None:
    """eval_cli as if imported from ``root/pkg/graft/commands/eval_cli.py`` (a source checkout when ``checkout``), run
    from ``root/work/here``."""
    from graft.commands import eval_cli

    (root / "pkg" / "graft").mkdir(parents=True)
    if checkout:
        (root / "pkg" / "pyproject.toml").write_text("")
    (root / "work" / "here").mkdir(parents=True)
    monkeypatch.setattr(eval_cli, "__file__", str(root / "pkg" / "graft" / "commands" / "eval_cli.py"))
    monkeypatch.chdir(root / "work" / "here")
    monkeypatch.delenv("GRAFT_DATA_DIR", raising=False)


def test_eval_data_dir_of_an_installed_package_is_refused_naming_what_was_tried(tmp_path, monkeypatch, capsys):
    """issue 38: installed (no checkout around the package) and not beside a shared/data folder, `--data math500`
    names where it looked and how to say where the files are."""
    from graft.commands import eval_cli

    _installed_as(monkeypatch, tmp_path, checkout=False)
    (tmp_path / "shared" / "data").mkdir(parents=True)   # beside the package, but it is no checkout
    assert eval_cli.default_data_dir() is None
    assert main(["eval", "--model", "x", "--data", "math500"]) == 2
    assert capsys.readouterr().err == (f"error: --data math500: no data folder found (tried {tmp_path / 'work' / 'shared' / 'data'}); "
                                       "pass --data-dir DIR or set GRAFT_DATA_DIR (the folder holding math500.jsonl)\n")


def test_eval_data_dir_comes_from_the_environment_then_the_working_directory_then_the_checkout(tmp_path, monkeypatch):
    from graft.commands import eval_cli

    _installed_as(monkeypatch, tmp_path, checkout=True)
    beside_checkout = tmp_path / "shared" / "data"
    beside_checkout.mkdir(parents=True)
    assert eval_cli.default_data_dir() == beside_checkout
    beside_cwd = tmp_path / "work" / "shared" / "data"
    beside_cwd.mkdir(parents=True)
    assert eval_cli.default_data_dir() == beside_cwd
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "math500.jsonl").write_text("")
    monkeypatch.setenv("GRAFT_DATA_DIR", str(mine))
    assert eval_cli.parse_data_args(["math500"], eval_cli.default_data_dir()) == {"math500": str(mine / "math500.jsonl")}


def test_help_of_every_command_does_not_import_torch():
    """`graft CMD --help` is answered from graft/parsers.py, without importing the command's module (torch,
    transformers, matplotlib); the command parses its arguments with the same parser."""
    assert list(cli.PARSERS) == list(cli.COMMANDS)
    argvs = [[cmd, "--help"] for cmd in cli.COMMANDS] + [["store", "info", "-h"], ["config", "show", "--help"]]
    code = ("import json, sys\nfrom graft.commands.cli import main\nfor argv in json.loads(sys.argv[1]):\n"
            "    try:\n        main(argv)\n    except SystemExit as e:\n        assert e.code == 0, argv\n"
            "print(sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code, json.dumps(argvs)], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("usage: graft ") == len(argvs) and p.stdout.splitlines()[-1] == "[]"
    assert "usage: graft store info [-h] [--json] path" in p.stdout


def test_eval_and_export_parsers_agree_with_their_commands():
    from graft.commands.export import DTYPES
    from graft.commands.parsers import EVAL_MAX_NEW_TOKENS, export_parser
    from graft.evaluation.evaluate import DEFAULT_MAX_NEW_TOKENS
    assert EVAL_MAX_NEW_TOKENS == DEFAULT_MAX_NEW_TOKENS                # the limit eval's help states is the one used
    export_dtype = next(a for a in export_parser()._actions if a.dest == "dtype")
    assert list(export_dtype.choices) == list(DTYPES)
