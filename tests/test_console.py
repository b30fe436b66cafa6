"""Output of every command (issue 38 §3): one logging setup with -v/-q before or after the command, and off a
terminal no progress bar, graft's or a library's (transformers' "Loading weights"), only plain lines."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from graft import console
from tests.patience import patient

REPO = Path(__file__).resolve().parents[1]
ROWS = [{"id": f"q{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(3)]


def _graft(argv: list[str]) -> subprocess.CompletedProcess:
    """``graft ARGV`` in a child whose stderr is a pipe, not a terminal."""
    env = {k: v for k, v in os.environ.items() if k not in console.QUIET_ENV and k != "GRAFT_VERBOSITY"}
    return subprocess.run([sys.executable, "-m", "graft.cli", *argv], capture_output=True, text=True, cwd=REPO,
                          env={**env, "PYTHONPATH": str(REPO)}, timeout=patient(600))


def _eval_argv(tmp_path: Path, model: str, out: str) -> list[str]:
    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return ["eval", "--model", model, "--template", "plain", "--data", f"toy={data}", "--n", "2", "--repeats", "1",
            "--max-new-tokens", "4", "--verify-workers", "0", "--out", str(tmp_path / out), "--device", "cpu"]


@pytest.mark.parametrize("argv, verbosity, rest", [
    (["-v", "train", "c.yaml"], 1, ["train", "c.yaml"]),
    (["train", "c.yaml", "-q", "steps=2"], -1, ["train", "c.yaml", "steps=2"]),
    (["--verbose", "-v", "eval"], 2, ["eval"]),
    (["sweep", "c.yaml", "--", "-q"], 0, ["sweep", "c.yaml", "--", "-q"]),
])
def test_global_flags_are_taken_before_or_after_the_command(argv, verbosity, rest):
    assert console.split_flags(argv) == (verbosity, rest)


def test_eval_off_a_terminal_draws_no_bar_and_v_shows_its_progress_lines(tmp_path, tiny_llama_dir):
    p = _graft(["-v", *_eval_argv(tmp_path, tiny_llama_dir, "ev")])   # progress is on by default
    assert p.returncode == 0, p.stderr
    assert "\r" not in p.stderr and "Loading weights" not in p.stderr and "it/s" not in p.stderr, p.stderr
    assert "INFO graft.evaluation.evaluate: toy r0: 3/3 prompts" in p.stderr, p.stderr
    assert all(l.startswith("INFO graft.") for l in p.stderr.splitlines()), p.stderr   # no library warnings
    assert "| toy | 3 |" in p.stdout


def test_q_after_the_command_keeps_only_errors(tmp_path, tiny_llama_dir):
    p = _graft([*_eval_argv(tmp_path, tiny_llama_dir, "ev"), "-q"])
    assert p.returncode == 0, p.stderr
    assert p.stderr == "", p.stderr
    p = _graft(["-q", "eval", "--model", "x", "--data", "aime24", "--data-dir", str(tmp_path)])
    assert p.returncode == 2 and p.stderr.startswith("error: ")


def test_probe_off_a_terminal_draws_no_bar(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    models = (f"models=[{{name: A, path: '{tiny_llama_dir}', template: plain}}, "
              f"{{name: B, path: '{tiny_gemma_dir}', template: plain}}]")
    p = _graft(["probe", str(REPO / "configs" / "default.yaml"), "--prompts", "2", "--compat", models, "rollout.n=2",
                "rollout.max_new_tokens=4", "reward.workers=0", "threads=1", "batch_prompts=2",
                "update.num_minibatches=1", "progress=true"])
    assert p.returncode == 0, p.stderr
    assert "\r" not in p.stderr and "Loading weights" not in p.stderr and "it/s" not in p.stderr, p.stderr


def test_no_progress_silences_the_loading_bars_on_a_terminal_too(tmp_path, tiny_llama_dir, monkeypatch):
    from transformers.utils import logging as hf_logging

    from graft.commands.eval_cli import eval_main
    monkeypatch.setattr(console, "on_terminal", lambda: True)
    for k in console.QUIET_ENV:
        monkeypatch.delenv(k, raising=False)
    hf_logging.enable_progress_bar()
    try:
        assert eval_main([*_eval_argv(tmp_path, tiny_llama_dir, "ev")[1:], "--no-progress"]) == 0
        assert not hf_logging.is_progress_bar_enabled() and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    finally:
        hf_logging.enable_progress_bar()


def test_logging_levels_follow_the_flags(capsys, monkeypatch):
    log = logging.getLogger("graft.test_console")
    monkeypatch.setattr(console, "_quiet_transformers", lambda: None)   # -q would quieten transformers for the session
    try:
        for verbosity, shown in ((-1, ["error"]), (0, ["warning", "error"]), (1, ["info", "warning", "error"])):
            console.setup_logging(verbosity)
            log.info("info")
            log.warning("warning")
            log.error("error")
            err = capsys.readouterr().err
            assert [l.split(": ", 1)[1] for l in err.splitlines()] == shown, err
        assert logging.getLogger().handlers.count(console._HANDLER) == 1   # set up once, however often called
    finally:
        console.setup_logging(0)


def test_the_peft_gradient_checkpointing_deprecation_is_not_shown():
    console.setup_logging(0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.warn("`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning)
        warnings.warn("another deprecation", FutureWarning)
    assert [str(w.message) for w in seen] == ["another deprecation"]
