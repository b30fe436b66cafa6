"""Optimiser, LoRA adapters and checkpoints written by Policy.save."""
from __future__ import annotations

import pytest
import torch

from graft.config import LoraConfig, ModelConfig
from graft.policy.policy import Policy
from graft.policy.sampling import SamplingParams


def _data(pol):
    P = [pol.codec.encode_prompt("What is 2 + 3?"), pol.codec.encode_prompt("What is 7 * 6?")]
    R = [pol.codec.encode_response(" 5, so \\boxed{5}.", True), pol.codec.encode_response(" It is 42", False)]
    return P, R


def _step(pol, lr_scale=1.0):
    opt = pol.make_optimizer()
    P, R = _data(pol)
    logp, mask = pol.forward_logprobs(P, R, chunk=4)
    (-(logp * mask).sum() / mask.sum()).backward()
    opt.step()
    opt.zero_grad()
    return opt


def test_make_optimizer_full(tiny_llama_dir):
    cfg = ModelConfig(path=tiny_llama_dir, lr=3e-4, betas=(0.8, 0.95), weight_decay=0.01)
    pol = Policy.load(cfg)
    opt = pol.make_optimizer()
    assert isinstance(opt, torch.optim.AdamW)
    g = opt.param_groups[0]
    assert g["lr"] == 3e-4 and tuple(g["betas"]) == (0.8, 0.95) and g["weight_decay"] == 0.01
    assert sum(p.numel() for p in g["params"]) == sum(p.numel() for p in pol.model.parameters())


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_full_save_loads_with_transformers(kind, tiny_llama_dir, tiny_gemma_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    base = tiny_llama_dir if kind == "llama" else tiny_gemma_dir
    cfg = ModelConfig(path=base, template="plain", lr=1e-2)
    pol = Policy.load(cfg)
    P, R = _data(pol)
    before, _ = pol.forward_logprobs(P, R)
    _step(pol)
    with torch.no_grad():
        after, mask = pol.forward_logprobs(P, R)
    assert not torch.allclose(before.detach(), after)
    pol.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()
    # plain transformers reads it and gives the same logits
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ckpt"))
    ids = torch.tensor([P[0] + R[0]])
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, pol.model(ids).logits, atol=1e-5)
    assert len(AutoTokenizer.from_pretrained(str(tmp_path / "ckpt"))) == len(pol.tokenizer)
    # and Policy.load(weights_from=...) restores the trained weights
    pol2 = Policy.load(cfg, weights_from=str(tmp_path / "ckpt"))
    with torch.no_grad():
        again, _ = pol2.forward_logprobs(P, R)
    assert torch.allclose(again, after, atol=1e-6)


def test_lora_optimizer_save_load(tiny_llama_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    cfg = ModelConfig(path=tiny_llama_dir, template="plain", lr=1e-2,
                      lora=LoraConfig(enabled=True, r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    pol = Policy.load(cfg)
    trainable = {n for n, p in pol.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    opt = pol.make_optimizer()
    opt_ids = {id(p) for g in opt.param_groups for p in g["params"]}
    assert opt_ids == {id(p) for n, p in pol.model.named_parameters() if "lora_" in n}
    assert pol.num_parameters(trainable_only=True) < pol.num_parameters() / 10

    P, R = _data(pol)
    with torch.no_grad():
        before, _ = pol.forward_logprobs(P, R)
    base_before = {n: p.detach().clone() for n, p in pol.model.named_parameters() if "lora_" not in n}
    _step(pol)
    with torch.no_grad():
        after, _ = pol.forward_logprobs(P, R)
    assert not torch.allclose(before, after)  # the adapter moved the policy...
    for n, p in pol.model.named_parameters():  # ...and the base weights did not move
        if "lora_" not in n:
            assert torch.equal(p, base_before[n]), n

    pol.save(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "adapter" / "model.safetensors").exists()
    pol2 = Policy.load(cfg, weights_from=str(tmp_path / "adapter"))
    assert {n for n, p in pol2.model.named_parameters() if p.requires_grad} == trainable
    with torch.no_grad():
        again, _ = pol2.forward_logprobs(P, R)
    assert torch.allclose(again, after, atol=1e-6)
    # plain PEFT loads it on the base model too
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_llama_dir), str(tmp_path / "adapter"))
    ids = torch.tensor([P[0] + R[0]])
    with torch.no_grad():
        assert torch.allclose(peft_model(ids).logits, pol.model(ids).logits, atol=1e-5)
    # without lora in the config, the adapter is merged into the weights
    merged = Policy.load(ModelConfig(path=tiny_llama_dir, template="plain"), weights_from=str(tmp_path / "adapter"))
    with torch.no_grad():
        m, _ = merged.forward_logprobs(P, R)
    assert torch.allclose(m, after, atol=1e-5)
    assert all(p.requires_grad for p in merged.model.parameters())


def test_lora_generate_matches_forward(tiny_gemma_dir):
    cfg = ModelConfig(path=tiny_gemma_dir, template="plain", lr=1e-2, lora=LoraConfig(enabled=True, r=2, alpha=4))
    pol = Policy.load(cfg)
    _step(pol)  # a non-zero adapter
    prompts = [pol.codec.encode_prompt("What is 1 + 1?")]
    out = pol.generate(prompts, SamplingParams(n=3, max_new_tokens=6, seed=0))
    with torch.no_grad():
        logp, _ = pol.forward_logprobs(prompts * 3, [s.token_ids for s in out[0]])
    for b, s in enumerate(out[0]):
        assert torch.allclose(logp[b, :len(s.token_ids)], torch.tensor(s.logprobs), atol=1e-4)
