"""Issue 10, the CLI side of bad input: every row runs a `graft` command on a tiny config (the
tiny random models with real tokenizers) and must end with exit code 2, a last stderr line
`error: ...` naming the field or file, no traceback, and the run folder unchanged or absent.

Rows run in-process through ``graft.cli.main`` (an uncaught exception would fail the test with
its traceback); the rows marked ``subprocess`` run ``python -m graft.cli`` as a user would, to
show that nothing but the one line reaches stderr.
"""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from graft.commands.cli import main
from graft.storage.lock import LOCK_NAME
from tests.patience import patient


REPO = Path(__file__).resolve().parents[1]


@dataclass
class Ctx:
    tmp: Path
    mp: pytest.MonkeyPatch
    llama: str
    gemma: str

    @property
    def yaml(self) -> Path:
        return self.tmp / "tiny.yaml"

    @property
    def run(self) -> Path:
        return self.tmp / "run"


def _tiny_yaml(ctx: Ctx, extra: str = "") -> Path:
    ctx.yaml.write_text(f"""\
run_dir: {ctx.run}
steps: 1
batch_prompts: 4
seed: 3
progress: false
models:
  - {{name: A, path: '{ctx.llama}', template: plain, lr: 1.0e-3}}
  - {{name: B, path: '{ctx.gemma}', template: plain, lr: 1.0e-3}}
data:
  shuffle: false
  arithmetic: {{num_prompts: 16}}
rollout: {{n: 4, max_new_tokens: 6, batch_size: 16}}
reward: {{workers: 0}}
update: {{num_minibatches: 2, micro_batch_size: 8}}
checkpoint: {{save_final: true}}
{extra}""")
    return ctx.yaml


def _jsonl(path: Path, n: int, answer=lambda i: str(2 * i)) -> Path:
    path.write_text("".join(json.dumps({"id": f"p{i}", "problem": f"{i} + {i}", "answer": answer(i)}) + "\n" for i in range(n)))
    return path


# ----------------------------------------------------------------------------- row preparations

def small_data(ctx: Ctx) -> dict:
    return {"small": str(_jsonl(ctx.tmp / "small.jsonl", 3))}


def a_file(ctx: Ctx) -> dict:
    (ctx.tmp / "afile").write_text("x")
    return {"afile": str(ctx.tmp / "afile")}


def no_write_permission(ctx: Ctx) -> dict:
    real = os.access
    ctx.mp.setattr(os, "access", lambda p, mode: False if Path(p) == ctx.tmp else real(p, mode))  # root ignores chmod
    return {}


def models_folder_here(ctx: Ctx) -> dict:
    (ctx.tmp / "models").mkdir()
    ctx.mp.chdir(ctx.tmp)
    return {}


def offline(ctx: Ctx) -> dict:
    ctx.mp.setenv("HF_HUB_OFFLINE", "1")
    ctx.mp.setenv("HF_HUB_CACHE", str(ctx.tmp / "hub-cache"))
    return {}


def yaml_no_space_mapping(ctx: Ctx) -> dict:
    _tiny_yaml(ctx, "exchange: {delta_by_length: {8:0.01,12:0.9}}\n")
    return {}


def trained_then_data_changed(ctx: Ctx) -> dict:
    data = _jsonl(ctx.tmp / "train.jsonl", 8)
    assert main(["train", str(ctx.yaml), f"data.train={data}"]) == 0
    _jsonl(data, 8, lambda i: "7" if i == 3 else str(2 * i))   # one answer edited, same ids
    return {"data": str(data)}


def disk_full_on(suffix: str):
    def prepare(ctx: Ctx) -> dict:
        from graft.storage import checkpoint
        from graft.trainer import metrics

        def full(path, *a, **k):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

        if suffix == "metrics.jsonl":
            real_open = open
            ctx.mp.setattr(metrics, "open", lambda p, *a, **k: full(p) if str(p).endswith(suffix) else real_open(p, *a, **k),
                           raising=False)
        else:
            real_save = checkpoint.torch.save
            ctx.mp.setattr(checkpoint.torch, "save", lambda obj, p, *a, **k: full(p) if str(p).endswith(suffix)
                           else real_save(obj, p, *a, **k))
        return {}
    return prepare


def a_parquet_file(ctx: Ctx) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1]}), ctx.tmp / "data.parquet")
    return {"parquet": str(ctx.tmp / "data.parquet")}


def run_without_checkpoint(ctx: Ctx) -> dict:
    ctx.run.mkdir()
    (ctx.run / "config.yaml").write_text(ctx.yaml.read_text())
    return {}


# ----------------------------------------------------------------------------- the table

@dataclass
class Row:
    id: str
    argv: list[str]
    expect: str
    """Text the last stderr line must contain (after ``str.format`` with the row's paths)."""
    prepare: Callable[[Ctx], dict] | None = None
    subprocess: bool = False
    writes: bool = False
    """The failure comes mid-run (disk full): the run folder may hold the steps before it."""
    env: dict = field(default_factory=dict)


T = ["train", "{yaml}"]
ROWS = [
    Row("mode-GRPO", [*T, "exchange.mode=GRPO"], "exchange.mode: 'GRPO' is not one of graft, grpo", subprocess=True),
    Row("selection-Random", [*T, "exchange.selection=Random"], "exchange.selection: 'Random' is not one of ranked, random"),
    Row("adv_std-Unbiased", [*T, "update.adv_std=Unbiased"], "update.adv_std: 'Unbiased' is not one of unbiased, biased"),
    Row("backend-Local", [*T, "backend=Local"], "backend: 'Local' is not one of local, ray"),
    Row("balance-minimum", [*T, "exchange.balance=minimum"], "exchange.balance: 'minimum' is not one of min, none, asymmetric"),
    Row("template-Chat", [*T, "models.1.template=Chat"], "models.1.template: 'Chat' is not one of chat, plain, fewshot"),
    Row("max_new_tokens-0", [*T, "rollout.max_new_tokens=0"], "rollout.max_new_tokens: must be > 0, got 0"),
    Row("max_new_tokens-abc", [*T, "rollout.max_new_tokens=abc"], "rollout.max_new_tokens: expected an integer, got 'abc'"),
    Row("steps-abc", [*T, "steps=abc"], "steps: expected an integer, got 'abc'", subprocess=True),
    Row("workers--1", [*T, "reward.workers=-1"], "reward.workers: must be >= 0"),
    Row("batch_size-0", [*T, "rollout.batch_size=0"], "rollout.batch_size: must be >= 1"),
    Row("seed--1", [*T, "seed=-1", "data.shuffle=true"], "seed: must be >= 0, got -1"),
    Row("unknown-key", [*T, "exchange.gate=0.5"], "exchange.gate: unknown config key"),
    Row("bf16-sampler-without-recompute", [*T, "rollout.engine=hf-bf16"],
        "update.recompute_old_logprobs: must be true with rollout.engine=hf-bf16"),
    Row("autocast-without-recompute", [*T, "models.1.autocast=bfloat16"],
        "models.1.autocast: is bfloat16 but update.recompute_old_logprobs is false"),
    Row("autocast-over-bf16-weights", [*T, "models.0.autocast=bfloat16", "models.0.dtype=bfloat16",
                                       "update.recompute_old_logprobs=true"],
        "models.0.autocast: model A: autocast=bfloat16 computes in bf16 over float32 weights, but dtype is bfloat16"),
    Row("autocast-choice", [*T, "models.0.autocast=bf16"], "models.0.autocast: 'bf16' is not one of off, bfloat16"),
    Row("cpu-memory-choice", [*T, "cpu_memory=free"], "cpu_memory: 'free' is not one of keep, release"),
    Row("bad-override-value", [*T, "models.0.stop=["], "models.0.stop: '[' is not a valid value"),
    Row("delta_by_length-yaml-no-space", T, "exchange.delta_by_length: ", yaml_no_space_mapping),
    Row("eval.every-without-val", [*T, "eval.every=1"], "eval.every: is 1 but data.val is not set"),
    Row("batch-over-arithmetic", [*T, "batch_prompts=40"], "batch_prompts: 40 exceeds the 16 prompts of the arithmetic task"),
    Row("batch-over-data-file", [*T, "data.train={small}"], "batch_prompts: 4 exceeds the 3 usable prompts of data.train ({small})",
        small_data, subprocess=True),
    Row("data-file-missing", [*T, "data.train={tmp}/nope.jsonl"], "data.train: data file not found: {tmp}/nope.jsonl"),
    Row("run_dir-under-file", [*T, "run_dir={afile}/run"], "run_dir {afile}/run: cannot be created because {afile} is a file",
        a_file, subprocess=True),
    Row("run_dir-unwritable", [*T, "run_dir={tmp}/run"], "run_dir {tmp}/run: cannot be created: no write permission in {tmp}",
        no_write_permission),
    Row("model-relative-path", [*T, "models.0.path=models/foo"], "models.0.path: model path 'models/foo' does not exist",
        models_folder_here, subprocess=True),
    Row("model-hub-id-offline", [*T, "models.1.path=nobody/nomodel"],
        "models.1.path: model path 'nobody/nomodel' is not a local path", offline),
    Row("resume-after-data-changed", [*T, "data.train={data}", "steps=2", "resume=true"],
        "data.train ({data}) changed since {run}/checkpoints/step_000001 was saved", trained_then_data_changed),
    Row("disk-full-metrics", T, "cannot write {run}/metrics.jsonl: No space left on device", disk_full_on("metrics.jsonl"),
        writes=True),
    Row("disk-full-checkpoint", T, "optimizer.pt: No space left on device (disk full?)", disk_full_on("optimizer.pt"),
        writes=True),
    Row("store-info-parquet", ["store", "info", "{parquet}"], "{parquet} is a file but not a trajectory store step file",
        a_parquet_file),
    Row("eval-run-dir-without-checkpoint", ["eval", "--model", "{run}", "--data", "arithmetic"],
        "{run} is a run folder without a complete checkpoint", run_without_checkpoint),
]


def _snapshot(run: Path):
    if not run.exists():
        return None
    return sorted((str(p.relative_to(run)), p.stat().st_size, p.stat().st_mtime_ns) for p in run.rglob("*")
                  if p.name != LOCK_NAME)   # the folder lock names its latest holder


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_input_is_one_line_and_writes_nothing(row, tmp_path, monkeypatch, capsys, tiny_llama_dir, tiny_gemma_dir):
    """issue 10: every bad input listed in the issue ends with exit code 2, one `error:` line naming
    the field or file, no traceback, and the run folder unchanged or absent."""
    ctx = Ctx(tmp_path, monkeypatch, tiny_llama_dir, tiny_gemma_dir)
    _tiny_yaml(ctx)
    subs = {"yaml": str(ctx.yaml), "tmp": str(tmp_path), "run": str(ctx.run)}
    subs |= row.prepare(ctx) if row.prepare else {}
    capsys.readouterr()
    argv = [a.format(**subs) for a in row.argv]
    before = _snapshot(ctx.run)
    if row.subprocess:
        env = {**os.environ, "PYTHONPATH": str(REPO), **row.env}
        proc = subprocess.run([sys.executable, "-m", "graft.cli", *argv], capture_output=True, text=True, timeout=patient(300),
                              cwd=os.getcwd(), env=env)
        rc, err = proc.returncode, proc.stderr
    else:
        rc = main(argv)
        err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert "Traceback" not in err, err
    assert lines and lines[-1].startswith("error: "), err
    assert row.expect.format(**subs) in lines[-1], err
    if row.writes:
        assert not (ctx.run / "summary.json").exists()
    else:
        assert _snapshot(ctx.run) == before
