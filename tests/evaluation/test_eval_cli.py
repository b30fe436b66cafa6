"""`graft eval` / `graft report` end to end on tiny random models (real tokenizers, real grader)."""
from __future__ import annotations

import json

import pytest

from graft.commands.eval_cli import eval_main


def _write_data(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [{"id": f"q{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(3)]


def test_eval_cli_on_a_model_folder(tmp_path, tiny_llama_dir, capsys):

    data = _write_data(tmp_path / "toy.jsonl", ROWS)
    out = tmp_path / "ev"
    argv = ["--model", tiny_llama_dir, "--template", "plain", "--data", f"toy={data}", "--n", "2", "--repeats", "2",
            "--max-new-tokens", "4", "--verify-workers", "0", "--no-progress", "--out", str(out), "--device", "cpu"]
    assert eval_main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    d = res["datasets"]["toy"]
    assert d["num_prompts"] == 3 and d["repeats"] == 2
    assert 0.0 <= d["pass@1"]["mean"] <= 1.0 and "pass@2" in d
    assert res["protocol"]["temperature"] == 0.6 and res["protocol"]["top_p"] == 0.95
    for r in range(2):
        lines = (out / "toy" / f"repeat_{r}.jsonl").read_text().splitlines()
        assert [json.loads(l)["id"] for l in lines] == ["q0", "q1", "q2"]
        assert all(len(json.loads(l)["responses"]) == 2 for l in lines)
    printed = capsys.readouterr().out
    assert "| toy | 3 |" in printed
    # the mean reward beside pass@1: per repeat the mean over prompts of each prompt's mean reward, as recorded
    per_repeat = []
    for r in range(2):
        recs = [json.loads(l) for l in (out / "toy" / f"repeat_{r}.jsonl").read_text().splitlines()]
        per_repeat.append(sum(sum(x["rewards"]) / len(x["rewards"]) for x in recs) / len(recs))
    assert d["reward_mean"]["per_repeat"] == pytest.approx(per_repeat)
    assert "| dataset | prompts | pass@1 (%) | mean reward | n | repeats |" in printed
    assert "a success is a reward above 0.5" in printed and res["protocol"]["success_threshold"] == 0.5
    # a second call finds every prompt done and rewrites the same numbers
    before = (out / "toy" / "repeat_0.jsonl").read_bytes()
    assert eval_main(argv) == 0
    assert (out / "toy" / "repeat_0.jsonl").read_bytes() == before
    assert json.loads((out / "results.json").read_text())["datasets"]["toy"]["pass@1"] == d["pass@1"]


def test_eval_cli_errors_are_one_line(tmp_path, capsys):
    assert eval_main(["--model", "x", "--data", "aime24", "--data-dir", str(tmp_path)]) == 2
    assert "aime24" in capsys.readouterr().err
    assert eval_main(["--model", "x", "--data", "bad name=foo.jsonl"]) == 2
    bad = _write_data(tmp_path / "bad.jsonl", [ROWS[0], {"id": "q9"}])
    assert eval_main(["--model", "x", "--data", f"toy={bad}"]) == 2
    err = capsys.readouterr().err
    assert "line 2" in err and "--on-bad-row skip" in err and "data.on_bad_row" not in err   # eval's own switch


@pytest.mark.slow
def test_train_then_eval_checkpoint_and_report(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    """A tiny GRAFT run, then `graft eval` on its checkpoint and `graft analyze` / `graft report` on the run."""

    from graft.evaluation.analyze import analyze
    from graft.evaluation.report import PLOTS, report
    from graft.trainer import loop
    from tests.trainer.helpers import crafted_rewards, tiny_config

    crafted_rewards(monkeypatch)
    data = _write_data(tmp_path / "val.jsonl", ROWS[:2])
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, f"data.val={data}", "eval.every=1", "eval.n=2",
                      "eval.max_new_tokens=4", "exchange.balance=none")
    loop.train(cfg)
    run = tmp_path / "run"
    a = analyze(run)
    assert set(a["complementarity"]) == {"A->B", "B->A"} and a["complementarity"]["A->B"]["source"] == "store"
    assert a["complementarity"]["A->B"]["overall"] == 1.0  # crafted rewards: the peer always solves
    assert sum(a["exchange"][d]["totals"]["transferred"] for d in ("A->B", "B->A")) > 0
    assert "eval/A/val/pass@1" in a["eval"]
    md = report([run], tmp_path / "rep").read_text()
    for name in PLOTS:
        assert f"]({name})" in md and (tmp_path / "rep" / name).stat().st_size > 1000
    ckpt = next((run / "checkpoints").glob("step_*")) / "B"
    out = tmp_path / "ev"
    assert eval_main(["--model", str(ckpt), "--data", f"val={data}", "--n", "2", "--repeats", "1",
                      "--max-new-tokens", "4", "--verify-workers", "0", "--no-progress", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["datasets"]["val"]["num_prompts"] == 2


def test_vllm_backend_prompt_encoding_matches_policy(tmp_path, tiny_llama_dir, capsys):
    from graft.config import ModelConfig
    from graft.policy.codec import TextCodec
    from graft.policy.policy import Policy

    cfg = ModelConfig(name="A", path=tiny_llama_dir, template="plain")
    pol = Policy.load(cfg)
    enc = TextCodec.load(cfg)
    assert enc.encode_prompt("What is 2 + 2?") == pol.codec.encode_prompt("What is 2 + 2?")
    data = _write_data(tmp_path / "toy.jsonl", ROWS)
    rc = eval_main(["--model", tiny_llama_dir, "--data", f"toy={data}", "--backend", "vllm", "--no-progress",
                    "--out", str(tmp_path / "ev")])
    err = capsys.readouterr().err
    import importlib.util

    import torch
    if importlib.util.find_spec("vllm") is None or not torch.cuda.is_available():
        assert rc == 2 and "backend vllm" in err


def test_bf16_backend_evaluates_and_records_itself(tmp_path, tiny_llama_dir):
    data = _write_data(tmp_path / "toy.jsonl", ROWS)
    outs = {}
    for backend in ("hf", "hf-bf16"):
        out = tmp_path / backend
        assert eval_main(["--model", tiny_llama_dir, "--data", f"toy={data}", "--backend", backend, "--n", "4",
                          "--repeats", "1", "--max-new-tokens", "8", "--verify-workers", "0", "--no-progress",
                          "--out", str(out)]) == 0
        res = json.loads((out / "results.json").read_text())
        assert res["protocol"]["backend"] == backend and res["datasets"]["toy"]["num_prompts"] == len(ROWS)
        outs[backend] = sorted((out / "toy").glob("*.jsonl"))[0].read_text()
    assert outs["hf"] != outs["hf-bf16"]     # the bf16 copy samples other tokens from the same seeds


def test_answer_form_reaches_the_grader_and_the_protocol(tmp_path, tiny_llama_dir):
    from graft.reward.worker import DEFAULT_VERIFY_FN, NUMBER_VERIFY_FN

    data = _write_data(tmp_path / "toy.jsonl", ROWS)
    for form, fn in (("number", NUMBER_VERIFY_FN), (None, DEFAULT_VERIFY_FN)):
        out = tmp_path / str(form)
        argv = ["--model", tiny_llama_dir, "--data", f"toy={data}", "--n", "2", "--repeats", "1", "--max-new-tokens", "4",
                "--verify-workers", "0", "--no-progress", "--out", str(out)] + (["--answer-form", form] if form else [])
        assert eval_main(argv) == 0
        assert json.loads((out / "results.json").read_text())["protocol"]["verify_fn"] == fn
