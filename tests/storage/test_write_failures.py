"""Issue 40: a write that fails (a full disk, a file-size limit) ends in one line
`error: cannot write FILE: cause (disk full?)`, exit 2, no traceback, with nothing earlier harmed.

Failures are real: the kernel refuses the write with EFBIG under ``RLIMIT_FSIZE``. In-process runs
lower the limit only while one writer runs (:func:`limit_inside`), so each writer in turn is the one
that fails; one subprocess run has the limit for its whole life, as a user's `ulimit -f` would.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import transformers
from safetensors.torch import load_file

from graft.commands.cli import main
from graft.config import save_config
from graft.evaluation import evaluate
from graft.files import OutputError, output_error, write_text
from graft.policy.policy import Policy
from graft.storage import checkpoint
from graft.storage.checkpoint import load_checkpoint
from graft.storage.trajectory_store import TrajectoryStore
from graft.trainer.metrics import JsonlWriter
from tests.trainer.helpers import crafted_rewards, tiny_config

REPO = Path(__file__).resolve().parents[2]
FULL = r": File too large \(disk full\?\)$"
TORCH_FULL = r": (unexpected pos \d+ vs \d+|basic_ios::clear: iostream error|.*file write failed) \(\d+ MiB free; disk full\?\)$"
CKPT = r"checkpoints/\.tmp-step_000001-\d+/"


@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """While the block runs, a write past ``nbytes`` of any file fails with EFBIG (SIGXFSZ ignored)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def limit_inside(mp: pytest.MonkeyPatch, owner, name: str, nbytes, when=lambda *a, **k: True) -> None:
    """``owner.name`` runs under :func:`file_size_limit` when ``when(*args)`` holds (``nbytes``: a number, or
    a function of the arguments)."""
    real = getattr(owner, name)

    def limited(*a, **k):
        if not when(*a, **k):
            return real(*a, **k)
        with file_size_limit(nbytes(*a, **k) if callable(nbytes) else nbytes):
            return real(*a, **k)
    mp.setattr(owner, name, limited)


def _named(name: str, parent: str = ""):
    return lambda target, *a, **k: Path(target).name == name and parent in str(Path(target).parent)


def _writer_named(name: str):
    return lambda self, *a, **k: self.path.name == name


# id, what runs under the limit (owner, attribute, bytes, when), the file the line names (a regex after the run
# folder), extra config (None: one model, GRPO; "pair": two models exchanging, with the crafted rewards)
CASES = [
    ("run-config", (Path, "write_text", 16, lambda p, *a: p.parent.name == "run" and p.name == "config.yaml"),
     "config.yaml" + FULL, None),
    ("metrics", (JsonlWriter, "write", 16, _writer_named("metrics.jsonl")), "metrics.jsonl" + FULL, None),
    ("audit", (JsonlWriter, "write", 16, _writer_named("audit.jsonl")), "audit.jsonl" + FULL, "pair"),
    ("trajectories", (TrajectoryStore, "write_step", 64, lambda *a, **k: True),
     r"trajectories/step_000001\.parquet" + FULL, None),
    ("weights", (Policy, "save", 100_000, lambda *a, **k: True), CKPT + r"A/model\.safetensors" + FULL, None),
    ("tokenizer", (transformers.PreTrainedTokenizerFast, "save_pretrained", 4096, lambda *a, **k: True),
     CKPT + r"A/tokenizer\.json" + FULL, None),
    ("tokenizer-shared-copy", (checkpoint.shutil, "copy2", 4096, lambda src, dst, *a, **k: "tokenizers" in str(dst)),
     r"checkpoints/tokenizers/\.tmp-A-[0-9a-f]+-\d+/tokenizer\.json" + FULL, None),
    ("optimizer", (checkpoint.torch, "save", 1000, lambda obj, p, *a, **k: Path(p).name == "optimizer.pt"),
     CKPT + r"A/optimizer\.pt" + TORCH_FULL, None),
    ("state", (checkpoint.torch, "save", 1000, lambda obj, p, *a, **k: Path(p).name == "state.pt"),
     CKPT + r"state\.pt" + TORCH_FULL, None),
    ("checkpoint-config", (Path, "write_text", 16, _named("config.yaml", ".tmp-step_")), CKPT + "config.yaml" + FULL, None),
    ("manifest", (checkpoint, "_write_manifest", 16, lambda *a, **k: True), CKPT + r"manifest\.json" + FULL, None),
    ("eval-records", (evaluate, "_append", 16, lambda *a, **k: True), r"eval/step_000001/A/val/repeat_0\.jsonl" + FULL,
     "eval"),
    ("eval-results", (Path, "write_text", 16, _named("results.json")), r"eval/step_000001/A/results\.json" + FULL, "eval"),
    ("summary", (Path, "write_text", 16, _named("summary.json")), r"summary\.json" + FULL, None),
]


def _config(tmp_path: Path, llama: str, kind: str | None, *overrides: str) -> Path:
    extra = {"pair": (), "eval": ("data.val=arithmetic", "data.val_limit=2", "eval.every=1", "eval.n=1")}.get(kind, ())
    models = ("A", "B") if kind == "pair" else ("A",)
    mode = () if kind == "pair" else ("exchange.mode=grpo",)
    cfg = tiny_config(tmp_path, llama, llama, "steps=1", *mode, *extra, *overrides, models=models)
    tmp_path.mkdir(exist_ok=True)
    save_config(cfg, tmp_path / "cfg.yaml")
    return tmp_path / "cfg.yaml"


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [l for l in err.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: cannot write "), err
    return lines[0]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_writer_failing_is_one_line_and_exit_2(case, tmp_path, tiny_llama_dir, monkeypatch, capsys):
    """issue 40: every writer of a run, failing mid-write, stops the run with one line naming its file."""
    _, (owner, attr, nbytes, when), names, kind = case
    yaml_path = _config(tmp_path, tiny_llama_dir, kind)
    if kind == "pair":
        crafted_rewards(monkeypatch)
    limit_inside(monkeypatch, owner, attr, nbytes, when)
    capsys.readouterr()
    assert main(["train", str(yaml_path)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert re.search(f"^error: cannot write {re.escape(str(tmp_path / 'run'))}/{names}", line), line
    assert not list((tmp_path / "run").glob("checkpoints/.tmp-*"))


def test_weights_over_a_file_size_limit_in_a_real_process(tmp_path, tiny_llama_dir):
    """issue 40: `python -m graft.cli train` under `ulimit -f` (1 MB): safetensors' SafetensorError for the
    weights was a traceback and exit 1; it is one line naming the weights file and exit 2."""
    yaml_path = _config(tmp_path, tiny_llama_dir, None)

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-m", "graft.cli", "train", str(yaml_path)], capture_output=True, text=True,
                          timeout=300, env=env, preexec_fn=limit)
    assert proc.returncode == 2, proc.stderr
    line = _one_error_line(proc.stderr)
    assert re.search(f"{re.escape(str(tmp_path / 'run'))}/{CKPT}A/model\\.safetensors{FULL}", line), line
    assert not (tmp_path / "run" / "checkpoints").exists() or not list((tmp_path / "run" / "checkpoints").iterdir())


def _metric_rows(run: Path) -> list[tuple]:
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["A/reward/mean"], r["A/loss"], r["A/grad_norm"]) for r in rows]


TWO_STEPS = ("steps=2", "checkpoint.save_every=1")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_llama_dir) -> Path:
    """The run folder of an uninterrupted two-step run."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    assert main(["train", str(_config(tmp, tiny_llama_dir, None, *TWO_STEPS))]) == 0
    return tmp / "run"


@pytest.mark.parametrize("writer", ["weights", "metrics"])
def test_resume_after_a_failed_write_matches_an_uninterrupted_run(writer, uninterrupted, tmp_path, tiny_llama_dir,
                                                                  monkeypatch, capsys):
    """issue 40: a write failing at step 2 leaves step 1's checkpoint intact (sha256), and `resume=true` ends
    where an uninterrupted run does: the same weights and the same metrics."""
    yaml_path = _config(tmp_path, tiny_llama_dir, None, *TWO_STEPS)
    with monkeypatch.context() as mp:
        if writer == "weights":
            limit_inside(mp, Policy, "save", 100_000, lambda self, p: "step_000002" in str(p))
        else:
            limit_inside(mp, JsonlWriter, "write", lambda self, rec: self.path.stat().st_size + 10,   # a torn line
                         lambda self, rec: self.path.name == "metrics.jsonl" and rec["step"] == 2)
        capsys.readouterr()
        assert main(["train", str(yaml_path)]) == 2
    _one_error_line(capsys.readouterr().err)
    run = tmp_path / "run"
    load_checkpoint(run / "checkpoints" / "step_000001", verify="full")
    assert not (run / "checkpoints" / "step_000002").exists()
    assert main(["train", str(yaml_path), "resume=true"]) == 0
    final = "checkpoints/step_000002/A/model.safetensors"
    got, want = load_file(run / final), load_file(uninterrupted / final)
    assert got.keys() == want.keys() and all((got[k] == want[k]).all() for k in got)
    assert _metric_rows(run) == _metric_rows(uninterrupted)


class SafetensorError(Exception):
    """Stands in for safetensors' own (a Rust exception type, neither OSError nor RuntimeError)."""


@pytest.mark.parametrize("exc", [
    SafetensorError("Error while serializing: I/O error: File too large (os error 27)"),
    SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'),
    Exception("No space left on device (os error 28)"),   # tokenizers' Tokenizer.save
])
def test_output_error_reads_the_os_error_a_rust_writer_quotes(exc, tmp_path):
    """issue 40: safetensors and tokenizers report a failed write with the OS error in their message only."""
    target = tmp_path / "A" / "model.safetensors"
    err = output_error(exc, target)
    assert isinstance(err, OutputError)
    assert re.fullmatch(f"cannot write {re.escape(str(target))}: (File too large|No space left on device) \\(disk full\\?\\)",
                        str(err)), str(err)
    assert output_error(err, tmp_path) is err
    assert output_error(SafetensorError("Error while deserializing header: HeaderTooLarge"), target) is None
    assert output_error(Exception("No such file or directory (os error 2)"), target) is None


def test_output_error_names_the_destination_of_a_copy(tmp_path):
    """A failed copy (shutil's sendfile) names source and destination; the destination is the file not written."""
    e = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "src"), None, str(tmp_path / "dst"))
    assert str(output_error(e, tmp_path)) == f"cannot write {tmp_path / 'dst'}: No space left on device (disk full?)"


def test_write_text_under_a_file_size_limit_names_its_file(tmp_path):
    with file_size_limit(8), pytest.raises(OutputError, match=f"^cannot write {re.escape(str(tmp_path / 'x.txt'))}{FULL}"):
        write_text(tmp_path / "x.txt", "x" * 100)
