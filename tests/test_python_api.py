"""The Python API (docs/python-api.md) end to end on the tiny models: the page's example as written, a script with
no main guard and its own reward callables, a callback that stops a run which then resumes to the same weights as
an uninterrupted one, and the one-line refusals of Python-built configs and data."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

import graft
from graft.config import ConfigError
from graft.errors import UserError
from tests.trainer.helpers import tiny_config

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"
REPO = Path(__file__).resolve().parents[1]


def tiny_overrides(tmp_path: Path, llama: str, gemma: str) -> list[str]:
    """The docs example's models and sizes swapped for the tiny random models (same tokenizers), small batches."""
    models = f"[{{name: smollm2, path: '{llama}', template: plain}}, {{name: gemma3, path: '{gemma}', template: plain}}]"
    return [f"models={models}", "batch_prompts=2", "rollout.n=2", "rollout.max_new_tokens=6", "rollout.batch_size=8",
            "update.num_minibatches=1", "update.micro_batch_size=8", "progress=false", "threads=1",
            f"run_dir={tmp_path / 'run'}"]


def test_the_docs_example_runs_as_written(tmp_path, monkeypatch, tiny_llama_dir, tiny_gemma_dir, capsys):
    code = re.search(r"```python\n(.*?)```", DOCS.read_text(), re.S).group(1)
    real = graft.load_config
    monkeypatch.setattr(graft, "load_config", lambda source="default", overrides=(): real(
        source, [*overrides, *tiny_overrides(tmp_path, tiny_llama_dir, tiny_gemma_dir)]), raising=False)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(DOCS), "exec"), {"__name__": "docs_example"})
    out = capsys.readouterr().out
    assert "3 steps;" in out
    run = graft.load_run(tmp_path / "run")
    assert [m["step"] for m in run.metrics] == [1, 2, 3]
    assert run.summary["steps"] == 3 and run.summary["stopped_at"] is None
    for line in ("1 {", "2 {", "3 {"):                   # the callback printed after every step
        assert re.search(rf"^{line}", out, re.M), out
    answers = {f"What is {a} + {b}? Put the answer in \\boxed{{}}.": str(a + b) for a in range(10) for b in range(10)}
    for s in run.samples():                              # reward = correct + 0.1 * brief, recomputed from the text
        assert s.prompt_id.startswith("row-")            # the rows have no id: derived from their content
        boxed = s.response.rpartition("\\boxed{")[2].partition("}")[0].strip()
        expected = (1.0 if boxed == answers[s.problem] else 0.0) + 0.1 * max(0.0, 1.0 - len(s.response) / 400)
        assert s.reward == pytest.approx(expected, abs=1e-9), s


SCRIPT = '''
import sys
import graft

llama, gemma, run_dir = sys.argv[1:4]
rows = [{"id": f"q{i}", "question": f"Say {i}.", "target": str(i)} for i in range(6)]


def says_target(prompts, completions, target, **columns):
    return [1.0 if t in c else 0.0 for c, t in zip(completions, target)]


def parity(prompts, completions, **columns):
    return [0.25 + 0.125 * (len(c) % 2) for c in completions]


models = f"[{{name: A, path: '{llama}', template: plain}}, {{name: B, path: '{gemma}', template: plain}}]"
cfg = graft.load_config(None, [f"models={models}", f"run_dir={run_dir}", "steps=2", "batch_prompts=2", "rollout.n=2",
                               "rollout.max_new_tokens=5", "update.num_minibatches=1", "progress=false",
                               "reward.workers=1", "data.fields={problem: question}"])
seen = []
run = graft.train(cfg, reward_funcs=[says_target, parity], reward_weights=[1.0, 2.0], train_dataset=rows,
                  callbacks=[lambda step, m: seen.append(step)])
print("STEPS", seen, len(run.metrics))
'''


def test_a_script_without_main_guard_trains_with_its_own_callables(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    """No ``if __name__ == "__main__":``: the reward worker (a forkserver process) must not run the script again, and
    the script's functions reach it by value; their values are the run's rewards."""
    script = tmp_path / "train_script.py"
    script.write_text(SCRIPT)
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, str(script), tiny_llama_dir, tiny_gemma_dir, str(run_dir)],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("STEPS") == 1 and "STEPS [1, 2] 2" in out.stdout    # the script ran once, 2 steps
    rows = [r for f in sorted((run_dir / "trajectories").glob("step_*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert len(rows) == 2 * 2 * 2 * 2                     # models x steps x prompts x samples
    for r in rows:
        target = json.loads(r["answer"])["target"]
        expected = (1.0 if target in r["response"] else 0.0) + 2.0 * (0.25 + 0.125 * (len(r["response"]) % 2))
        assert r["reward"] == expected, r
    saved = (run_dir / "config.yaml").read_text()
    assert "__main__:says_target" in saved and "<in-memory dataset: 6 rows>" in saved


def _weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    folder = run_dir / "checkpoints" / f"step_{step:06d}"
    return {f"{m}.{k}": v for m in ("A", "B") for k, v in load_file(folder / m / "model.safetensors").items()}


def score(prompts, completions, **columns):
    return [float(len(c) % 3 == 0) for c in completions]


def test_a_callback_that_stops_leaves_a_run_that_resumes_to_the_same_weights(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    rows = [{"id": f"p{i}", "problem": f"What is {i} + 1?"} for i in range(8)]

    def cfg(name: str, *more: str):
        return tiny_config(tmp_path / name, tiny_llama_dir, tiny_gemma_dir, "steps=3", "batch_prompts=2", "rollout.n=2",
                           "checkpoint.save_every=0", *more)

    whole = graft.train(cfg("whole"), reward_funcs=[score], train_dataset=rows)
    asked = []

    def stop_after_one(step, metrics):
        asked.append(step)
        if step == 1:
            raise graft.StopTraining

    part = graft.train(cfg("part"), reward_funcs=[score], train_dataset=rows, callbacks=[stop_after_one, lambda s, m: None])
    assert asked == [1] and part.summary["stopped_at"] == 1 and len(part.metrics) == 1
    assert (part.run_dir / "checkpoints" / "step_000001").is_dir()
    rest = graft.train(cfg("part", "resume=true"), reward_funcs=[score], train_dataset=rows, callbacks=[stop_after_one])
    assert asked == [1, 2, 3] and rest.summary["stopped_at"] is None
    assert [m["step"] for m in rest.metrics] == [1, 2, 3]
    a, b = _weights(whole.run_dir, 3), _weights(rest.run_dir, 3)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for m, n in zip(whole.metrics, rest.metrics, strict=True):
        assert m["A/reward/mean"] == n["A/reward/mean"] and m["B/reward/mean"] == n["B/reward/mean"]


def test_python_built_configs_and_data_are_checked_in_one_line(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir)
    with pytest.raises(ConfigError, match=r"^steps: .*must be"):
        graft.validate(dataclasses.replace(cfg, steps=-1))
    bad = copy.deepcopy(cfg)
    bad.rollout.n = 1                                       # changed after construction: validate still sees it
    with pytest.raises(ConfigError, match=r"rollout\.n"):
        graft.validate(bad)
    with pytest.raises(ConfigError, match=r"^data\.train: expected .*in-memory dataset.*got a set$"):
        graft.train(cfg, train_dataset={1, 2})
    with pytest.raises(ConfigError, match=r"reward\.function\.0"):
        graft.train(cfg, reward_funcs=[42])
    with pytest.raises(UserError, match="not a graft run folder"):
        graft.load_run(tmp_path / "nowhere")
    assert set(graft.API) <= set(dir(graft))
