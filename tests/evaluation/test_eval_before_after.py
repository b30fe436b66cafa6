"""Issue 22 §1: `graft eval --config RUN/config.yaml --model-name NAME` with no --model and no --data evaluates the
model's best (else latest) checkpoint on the run's data.val; `--compare base` adds the run's starting weights in
the same prompt format and prints both side by side (tiny random models, real tokenizers)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from graft.commands.cli import main
from graft.commands.eval_cli import compare_table
from graft.evaluation.evaluate import best_checkpoint, eval_history
from graft.storage.checkpoint import list_checkpoints
from graft.trainer import loop
from tests.trainer.helpers import crafted_rewards, tiny_config

FAST = ["--n", "1", "--repeats", "1", "--verify-workers", "0", "--no-progress", "--device", "cpu"]


def _train(tmp, llama, gemma, *extra) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        crafted_rewards(mp)
        cfg = tiny_config(tmp, llama, gemma, "checkpoint.save_every=1", "checkpoint.keep_last=3", *extra)
        loop.train(cfg)
    return Path(cfg.run_dir)


@pytest.fixture(scope="module")
def val_run(tmp_path_factory, tiny_llama_dir, tiny_gemma_dir):
    tmp = tmp_path_factory.mktemp("val_run")
    val = tmp / "val.jsonl"
    val.write_text("".join(json.dumps({"id": f"v{i}", "problem": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                           for i in range(3)))
    return _train(tmp, tiny_llama_dir, tiny_gemma_dir, f"data.val={val}", "eval.every=1", "eval.n=1")


def test_defaults_and_side_by_side(val_run, tmp_path, tiny_gemma_dir, capsys):
    out = tmp_path / "ev"
    assert main(["eval", "--config", str(val_run / "config.yaml"), "--model-name", "B", "--compare", "base",
                 "--out", str(out), *FAST]) == 0
    cks = list_checkpoints(val_run)
    best = best_checkpoint(eval_history(val_run, cks), "eval/B/val/pass@1", steps=[1, 2])
    assert best is not None                          # the run evaluated B at both saved steps
    trained, base = f"run-B-step{best}", "run-B-base"
    res = {label: json.loads((out / label / "results.json").read_text()) for label in (base, trained)}
    assert res[trained]["protocol"]["model"] == str(val_run / "checkpoints" / f"step_{best:06d}" / "B")
    assert res[base]["protocol"]["model"] == tiny_gemma_dir                       # the run's starting weights
    for r in res.values():
        assert list(r["datasets"]) == ["val"] and r["datasets"]["val"]["num_prompts"] == 3   # the run's data.val
    printed = capsys.readouterr().out
    assert compare_table(res) in printed                                          # base first, then trained
    assert f"| dataset | prompts | {base} pass@1 (%) | {trained} pass@1 (%) | {trained} − {base} (points) |" in printed


def test_compare_table_hand_worked():
    def res(p):   # one dataset of 4 prompts, pass@1 mean p over one repeat
        return {"datasets": {"val": {"num_prompts": 4, "pass@1": {"mean": p, "std": 0.0}}}}
    table = compare_table({"base": res(0.25), "best": res(0.5)}).splitlines()
    # 50.0 % - 25.0 % = +25.0 points
    assert table[2].startswith("| val | 4 | 25.0") and table[2].endswith("| +25.0 |")


def test_latest_when_nothing_was_evaluated_and_the_data_error(tmp_path, tiny_llama_dir, tiny_gemma_dir, capsys):
    run = _train(tmp_path, tiny_llama_dir, tiny_gemma_dir)             # no data.val, no in-training evaluation
    cfg = str(run / "config.yaml")
    capsys.readouterr()
    assert main(["eval", "--config", cfg, "--model-name", "A", *FAST]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no data.val; name the set to evaluate on with --data" in err[0]
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"id": "q", "problem": "What is 1 + 1?", "answer": "2"}) + "\n")
    assert main(["eval", "--config", cfg, "--model-name", "A", "--data", f"d={data}", "--out", str(tmp_path / "ev"),
                 *FAST]) == 0
    res = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert res["protocol"]["model"] == str(run / "checkpoints" / "step_000002" / "A")   # the latest of steps 1, 2
    assert main(["eval", "--model", "x", *FAST]) == 2                   # no --config: --data is still required
    assert "--model and --data are required without --config" in capsys.readouterr().err

    # the run still training pruned the checkpoint just chosen, before eval could hold it: eval chooses again
    from graft.commands import eval_cli
    chosen = []

    def pruned_first(run_dir, which, model):
        chosen.append(which)
        return run_dir / "checkpoints" / "step_000009" if len(chosen) == 1 else select(run_dir, which, model)

    select = eval_cli.select_checkpoint
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(eval_cli, "select_checkpoint", pruned_first)
        assert main(["eval", "--config", cfg, "--model-name", "A", "--model", "latest", "--data", f"d={data}",
                     "--out", str(tmp_path / "ev2"), *FAST]) == 0
    assert chosen == ["latest", "latest"]
    res = json.loads((tmp_path / "ev2" / "results.json").read_text())
    assert res["protocol"]["model"] == str(run / "checkpoints" / "step_000002" / "A")
