"""`graft export` and the checkpoint policies of a run (keep_best, keep_optimizer, resume refusal)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from graft.commands.cli import main
from graft.config import ModelConfig, load_config, save_config
from graft.storage.checkpoint import list_checkpoints, load_checkpoint
from graft.trainer import loop
from tests.trainer.helpers import crafted_rewards, tiny_config

# Crafted in-training validation pass@1 per model and step: best A = step 2, best B = step 1.
PASS1 = {"A": {1: 0.2, 2: 0.5, 3: 0.1, 4: 0.3}, "B": {1: 0.4, 2: 0.1, 3: 0.1, 4: 0.2}}


def _crafted_eval(policy, datasets, grader, eval_cfg=None, *, out_dir, **_):
    step, name = int(Path(out_dir).parent.name.split("_")[1]), Path(out_dir).name
    return {"val/pass@1": PASS1[name][step]}


def _val(tmp: Path) -> Path:
    p = tmp / "val.jsonl"
    p.write_text(json.dumps({"id": "v0", "problem": "What is 1 + 1?", "answer": "2"}) + "\n")
    return p


@pytest.fixture(scope="module")
def graft_run(tmp_path_factory, tiny_llama_dir, tiny_gemma_dir):
    """4 steps, a checkpoint every step, keep_last=1 + the best step of each model + multiples of keep_period=3,
    optimizer only in the newest."""
    tmp = tmp_path_factory.mktemp("export_run")
    with pytest.MonkeyPatch.context() as mp:
        crafted_rewards(mp)
        mp.setattr(loop, "evaluate_during_training", _crafted_eval)
        cfg = tiny_config(tmp, tiny_llama_dir, tiny_gemma_dir, "steps=4", f"data.val={_val(tmp)}", "eval.every=1",
                          "checkpoint.save_every=1", "checkpoint.keep_last=1", "checkpoint.keep_best=true",
                          "checkpoint.keep_optimizer=last", "checkpoint.keep_period=3")
        loop.train(cfg)
    return Path(cfg.run_dir), cfg


def _steps(run_dir: Path) -> list[int]:
    return [load_checkpoint(p).step for p in list_checkpoints(run_dir)]


def _logprobs(model, seqs: list[list[int]]) -> list[torch.Tensor]:
    """log p(token t | tokens < t) of fixed sequences, with a plain transformers forward."""
    out = []
    with torch.no_grad():
        for ids in seqs:
            x = torch.tensor([ids])
            lp = model(input_ids=x).logits.float().log_softmax(-1)[0, :-1]
            out.append(lp.gather(-1, x[0, 1:, None]).squeeze(-1))
    return out


def _seqs(folder) -> list[list[int]]:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(folder))
    return [tok("Problem: What is 12 + 30?\nSolution: 12 + 30 = 42. \\boxed{42}")["input_ids"],
            tok("The final answer is 7.")["input_ids"]]


# ----------------------------------------------------------------------------- checkpoint policies in a run

def test_run_keeps_the_best_steps_the_period_and_optimizer_only_in_the_newest(graft_run):
    run_dir, _ = graft_run
    assert _steps(run_dir) == [1, 2, 3, 4]       # keep_last=1 keeps 4; 2 (best of A), 1 (best of B), 3 (period) survive
    with_opt = [load_checkpoint(p).step for p in list_checkpoints(run_dir) if (p / "A" / "optimizer.pt").exists()]
    assert with_opt == [4]
    for p in list_checkpoints(run_dir):
        load_checkpoint(p, verify="full")        # every manifest matches its files


def test_resume_from_a_checkpoint_without_optimizer_refuses_in_one_line(graft_run, tmp_path, capsys):
    run_dir, cfg = graft_run
    before = (run_dir / "metrics.jsonl").read_bytes(), _steps(run_dir)
    save_config(cfg, tmp_path / "cfg.yaml")
    rc = main(["train", str(tmp_path / "cfg.yaml"), f"resume={run_dir / 'checkpoints' / 'step_000002'}"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and last.startswith("error: cannot resume from")
    assert "step_000002" in last and "no optimizer state for model(s) A, B" in last
    assert str(run_dir / "checkpoints" / "step_000004") in last          # names the checkpoint that has it
    assert ((run_dir / "metrics.jsonl").read_bytes(), _steps(run_dir)) == before


# ----------------------------------------------------------------------------- export

def test_export_latest_gives_the_checkpoint_logprobs(graft_run, tmp_path):
    from transformers import AutoModelForCausalLM

    run_dir, _ = graft_run
    out = tmp_path / "A-latest"
    assert main(["export", str(run_dir), "--model", "A", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "README.md"} <= names
    assert not any(n.endswith(".bin") or n.startswith("adapter") or n == "optimizer.pt" for n in names)
    conf = json.loads((out / "config.json").read_text())
    assert conf["architectures"] == ["LlamaForCausalLM"] and conf["dtype"] == "float32"

    ck_dir = run_dir / "checkpoints" / "step_000004" / "A"
    exported = AutoModelForCausalLM.from_pretrained(str(out))
    original = AutoModelForCausalLM.from_pretrained(str(ck_dir))
    for a, b in zip(_logprobs(exported, _seqs(out)), _logprobs(original, _seqs(ck_dir))):
        assert (a - b).abs().max().item() <= 1e-6
    card = (out / "README.md").read_text()
    assert "step 4 of 4" in card and "Update rule: `graft`" in card and "co-trained with `B`" in card
    assert "| 2 | 50.00 |" in card and "| 4 (exported) | 30.00 |" in card   # A's crafted eval history
    assert "template `plain`" in card and '"\\nProblem:"' in card
    assert "## Provenance" in card and "transformers " in card and "graft 0.1.0" in card


def test_export_best_picks_each_models_best_evaluated_step(graft_run, tmp_path):
    run_dir, _ = graft_run
    for name, step in (("A", 2), ("B", 1)):
        out = tmp_path / f"{name}-best"
        assert main(["export", str(run_dir), "--step", "best", "--model", name, str(out)]) == 0
        assert f"step {step} of 4" in (out / "README.md").read_text()
        got = load_file(str(out / "model.safetensors"))
        want = load_file(str(run_dir / "checkpoints" / f"step_{step:06d}" / name / "model.safetensors"))
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)


def test_bf16_export_loads(graft_run, tmp_path):
    from transformers import AutoModelForCausalLM

    run_dir, _ = graft_run
    out = tmp_path / "B-bf16"
    assert main(["export", str(run_dir), "--step", "4", "--model", "B", str(out), "--dtype", "bfloat16"]) == 0
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert model.dtype == torch.bfloat16 and json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Gemma3ForCausalLM"]
    want = load_file(str(run_dir / "checkpoints" / "step_000004" / "B" / "model.safetensors"))
    got = load_file(str(out / "model.safetensors"))
    assert all(torch.equal(got[k], want[k].to(torch.bfloat16)) for k in want)
    lp = _logprobs(model, _seqs(out))
    assert all(torch.isfinite(x).all() for x in lp)


def test_export_errors_are_one_line(graft_run, tmp_path, capsys):
    run_dir, _ = graft_run

    def err(*argv):
        assert main(["export", *argv]) == 2
        return capsys.readouterr().err.strip().splitlines()[-1]

    assert "no checkpoint at step 5; saved steps: [1, 2, 3, 4]" in err(str(run_dir), "--step", "5", "--model", "A",
                                                                       str(tmp_path / "x"))
    assert "has no model 'C'; it holds: A, B" in err(str(run_dir), "--model", "C", str(tmp_path / "x"))
    assert "choose the model to export with --model" in err(str(run_dir), str(tmp_path / "x"))
    assert "run folder not found" in err(str(tmp_path / "nope"), "--model", "A", str(tmp_path / "x"))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    assert "not empty" in err(str(run_dir), "--model", "A", str(tmp_path / "full"))
    assert not (tmp_path / "x").exists()


def test_lora_export_merges_the_adapter(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM

    from graft.policy.policy import Policy

    crafted_rewards(monkeypatch)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=1", "exchange.mode=grpo",
                      "models.0.lora.enabled=true", models=("A",))
    loop.train(cfg)
    run_dir = Path(cfg.run_dir)
    ck = list_checkpoints(run_dir)[-1] / "A"
    assert (ck / "adapter_config.json").is_file()
    out = tmp_path / "merged"
    assert main(["export", str(run_dir), str(out)]) == 0            # the only model of the run
    assert not (out / "adapter_config.json").exists() and (out / "model.safetensors").is_file()
    merged = AutoModelForCausalLM.from_pretrained(str(out))
    peft = Policy.load(load_config(run_dir / "config.yaml").models[0], weights_from=str(ck)).model
    base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    seqs = _seqs(out)
    for m, p, b in zip(_logprobs(merged, seqs), _logprobs(peft, seqs), _logprobs(base, seqs)):
        assert (m - p).abs().max().item() <= 1e-5          # merged weights = base + scaled B @ A
        assert (m - b).abs().max().item() > 1e-4           # and the adapter did change the model
    assert "LoRA adapter merged" in (out / "README.md").read_text()
    assert main(["export", str(run_dir), "--step", "best", str(tmp_path / "y")]) == 2
    assert "has no eval/A/val/pass@1" in capsys.readouterr().err


def test_model_card_names_the_upstream_model_its_licence_versions_and_commit(graft_run):
    from graft.commands.export import model_card, provenance

    _, cfg = graft_run
    versions = {"torch": "2.13.0", "transformers": "5.24.0", "graft": "0.1.0", "graft_commit": "abc123"}
    gemma = ModelConfig(name="gemma3", path="embedded:gemma3-270m", template="plain")
    card = model_card(cfg, gemma, 4, Path("ck"), "float32", [], None, versions)
    assert "base_model: google/gemma-3-270m" in card
    assert "Gemma Terms of Use (https://ai.google.dev/gemma/terms)" in card
    assert "graft 0.1.0 (git commit `abc123`)" in card and "torch 2.13.0, transformers 5.24.0" in card
    smol = ModelConfig(name="smol", path="embedded:smollm2-135m-instruct", template="plain")
    card = model_card(cfg, smol, 4, Path("ck"), "float32", [], None, {**versions, "graft_commit": None})
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card and "Apache-2.0" in card
    assert "git commit: None" in card
    # a checkout's commit; a copy outside any git checkout has none
    import subprocess
    repo = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert provenance(repo)["graft_commit"] == (head or None)
    assert provenance(Path("/"))["graft_commit"] is None
