"""`graft eval --config RUN/config.yaml --model-name NAME`: the run's own prompt format, for base model and checkpoint."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import graft.commands.eval_cli as ev
from graft.commands.cli import main
from graft.config import ConfigError
from graft.policy import prompts
from graft.storage.trajectory_store import TrajectoryStore
from graft.trainer import loop
from tests.trainer.helpers import crafted_rewards, tiny_config

# Prompt settings that differ from every default: a chat model with one worked example and its own
# instruction; a few-shot base model with 3 examples and a custom stop string.
RUN_PROMPTS = ("models.0.template=chat", "models.0.fewshot=1", "models.0.instruction=Reply with the number only.",
               "models.1.template=fewshot", "models.1.fewshot=3", 'models.1.stop=["\\n\\nQ:"]')


@pytest.fixture(scope="module")
def prompt_run(tmp_path_factory, tiny_llama_dir, tiny_gemma_dir):
    tmp = tmp_path_factory.mktemp("prompt_run")
    with pytest.MonkeyPatch.context() as mp:
        crafted_rewards(mp)
        cfg = tiny_config(tmp, tiny_llama_dir, tiny_gemma_dir, "steps=1", *RUN_PROMPTS)
        loop.train(cfg)
    return Path(cfg.run_dir), cfg


def _stored(run_dir: Path, model: str) -> dict[str, str]:
    """problem -> prompt text exactly as the run's rollouts saw it (trajectory store)."""
    tab = TrajectoryStore(run_dir / "trajectories").read(columns=["model", "problem", "prompt_text"]).to_pylist()
    return {r["problem"]: r["prompt_text"] for r in tab if r["model"] == model}


def _eval_recording(monkeypatch, tmp_path, *argv) -> tuple[int, dict, list]:
    """Run `graft eval` and record the prompt ids it sampled from, and the generator's stop strings."""
    from graft.policy.codec import TextCodec

    seen, stops = {}, []
    real = TextCodec.encode_prompt

    def encode(codec, problem, messages=None):
        ids = real(codec, problem, messages)
        seen[problem] = ids
        stops.append(codec.cfg.stop_strings())
        return ids

    monkeypatch.setattr(TextCodec, "encode_prompt", encode)
    rc = main(["eval", *argv, "--n", "1", "--repeats", "1", "--verify-workers", "0", "--no-progress", "--device", "cpu"])
    return rc, seen, stops


@pytest.mark.parametrize("name, which", [("A", "base"), ("A", "checkpoint"), ("B", "base"), ("B", "checkpoint")])
def test_eval_with_the_run_config_uses_the_runs_prompt_ids(prompt_run, tmp_path, monkeypatch, tiny_llama_dir,
                                                           tiny_gemma_dir, name, which, capsys):
    from transformers import AutoTokenizer

    run_dir, cfg = prompt_run
    stored = _stored(run_dir, name)
    assert len(stored) == cfg.batch_prompts
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "problem": p, "answer": "0"}) + "\n" for i, p in enumerate(stored)))
    model = {"A": tiny_llama_dir, "B": tiny_gemma_dir}[name] if which == "base" else \
        str(run_dir / "checkpoints" / "step_000001" / name)
    rc, seen, stops = _eval_recording(monkeypatch, tmp_path, "--model", model, "--config", str(run_dir / "config.yaml"),
                                      "--model-name", name, "--data", f"d={data}", "--out", str(tmp_path / "ev"))
    assert rc == 0
    tok = AutoTokenizer.from_pretrained({"A": tiny_llama_dir, "B": tiny_gemma_dir}[name])
    assert set(seen) == set(stored)
    for problem, text in stored.items():
        assert seen[problem] == prompts.encode_prompt(tok, text)     # token for token what the rollouts saw
    want_stops = ["\n\nQ:"] if name == "B" else []
    assert all(s == want_stops for s in stops)                       # reachable through the policy's ModelConfig
    res = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert res["protocol"]["max_new_tokens"] == cfg.rollout.max_new_tokens   # the run's limit
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith(f"| d | {len(stored)} | ") and out[-1].endswith(" | 1 | 1 |")   # n, repeats
    template = "chat" if name == "A" else "fewshot"
    assert any(l.startswith(f"prompt: template {template}") for l in out)


def test_prompt_flags_override_the_defaults(tiny_gemma_dir):
    cfg, weights_from, run_cfg = ev._model_cfg_for(tiny_gemma_dir, "fewshot", fewshot=3, stop=["\\nQ:", "###"],
                                                   instruction="Answer in \\boxed{}.")
    assert weights_from is None and run_cfg is None
    assert (cfg.template, cfg.num_shots(), cfg.stop_strings(), cfg.instruction) == \
        ("fewshot", 3, ["\nQ:", "###"], "Answer in \\boxed{}.")
    text = prompts.fewshot_prompt("What is 1 + 1?", cfg.instruction, cfg.num_shots())
    assert text.count("Problem:") == 4 and text.count("Answer in \\boxed{}.") == 4
    assert ev._model_cfg_for(tiny_gemma_dir, "plain", stop=[""])[0].stop_strings() == []   # --stop '': none


def test_bad_prompt_flags_are_one_line_errors(prompt_run, tmp_path, capsys):
    run_dir, _ = prompt_run
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"id": "q", "problem": "1 + 1", "answer": "2"}) + "\n")
    base = ["eval", "--data", f"d={data}", "--out", str(tmp_path / "ev")]
    for argv, msg in (
        (["--model", "x", "--model-name", "A"], "--model-name needs --config"),
        (["--model", "x", "--config", str(run_dir / "config.yaml")], "choose one with --model-name"),
        (["--model", "x", "--config", str(run_dir), "--model-name", "C"], "'C' is not a model of"),
        (["--model", "x", "--template", "plain", "--fewshot", "2"], "fewshot examples need template chat or fewshot"),
    ):
        assert main(base + argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0], (argv, err)
    with pytest.raises(ConfigError, match="not found"):
        ev._model_cfg_for("x", config=str(tmp_path / "nope.yaml"))
    assert not (tmp_path / "ev").exists()
