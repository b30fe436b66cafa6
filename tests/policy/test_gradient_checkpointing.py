"""Issue 38: ``models.I.gradient_checkpointing`` recomputes the decoder layers in backward and changes no gradient,
with full weights and with a LoRA adapter."""
from __future__ import annotations

import pytest
import torch

from graft.config import LoraConfig, ModelConfig
from graft.policy.loading import unwrap
from graft.policy.policy import Policy

PROMPTS = [[1, 5, 9, 14], [1, 5, 9, 14], [1, 7, 3]]
RESPONSES = [[21, 22, 23, 24, 25], [21, 30], [40, 41, 42]]


def _grads(path: str, checkpointing: bool, lora: bool, monkeypatch) -> tuple[dict[str, torch.Tensor], int]:
    """Gradients of the summed response log-probs in train mode, and how often a decoder MLP ran in backward."""
    torch.manual_seed(0)   # the same fresh LoRA adapter both times
    cfg = ModelConfig(name="A", path=path, template="plain", gradient_checkpointing=checkpointing,
                      lora=LoraConfig(enabled=lora, r=4, alpha=8))
    pol = Policy.load(cfg)
    layers = unwrap(pol.model).get_decoder().layers
    assert all(layer.gradient_checkpointing == checkpointing for layer in layers)
    if lora:   # a fresh adapter's B is zero: give it values so that A's gradient is not zero either
        for n, p in pol.model.named_parameters():
            if "lora_B" in n:
                p.data.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
    calls = []
    mlp_forward = type(layers[0].mlp).forward   # counted on the class: hooks do not fire in a recomputation
    monkeypatch.setattr(type(layers[0].mlp), "forward", lambda self, *a, **k: calls.append(1) or mlp_forward(self, *a, **k))
    pol.model.train()
    logp, mask = pol.forward_logprobs(PROMPTS, RESPONSES)
    before = len(calls)
    (logp * mask).sum().backward()
    monkeypatch.undo()
    return {n: p.grad.clone() for n, p in pol.model.named_parameters() if p.requires_grad}, len(calls) - before


@pytest.mark.parametrize("lora", [False, True])
def test_checkpointing_changes_no_gradient(tiny_llama_dir, lora, monkeypatch):
    off, recomputed_off = _grads(tiny_llama_dir, False, lora, monkeypatch)
    on, recomputed_on = _grads(tiny_llama_dir, True, lora, monkeypatch)
    assert recomputed_off == 0 and recomputed_on == 2   # both layers ran again in backward
    assert off.keys() == on.keys() and off
    # The paths differ (checkpointing forwards prompt and response together; off, each distinct prompt once), so
    # they agree up to float rounding: ~6e-7 of each gradient's norm on the development VM, where a fixed atol of
    # 1e-6 left gradients of size ~5 at 0.86 of the tolerance. The absolute tolerance is scaled to each tensor's
    # largest entry, which a wrong recomputation (other positions, masks or weights) misses by orders of magnitude.
    for n in off:
        torch.testing.assert_close(on[n], off[n], rtol=1e-4, atol=1e-5 * off[n].abs().max().item(), msg=n)
        assert (on[n] - off[n]).norm() <= 1e-5 * off[n].norm(), n
    if lora:
        assert all("lora_" in n for n in on)


def test_checkpointing_off_in_eval(tiny_gemma_dir):
    """Generation and no-grad scoring run as without it (eval mode, the cached shared-prefix pass)."""
    plain = Policy.load(ModelConfig(name="B", path=tiny_gemma_dir, template="plain"))
    ckpt = Policy.load(ModelConfig(name="B", path=tiny_gemma_dir, template="plain", gradient_checkpointing=True))
    a = plain.token_logprobs(PROMPTS, RESPONSES)
    b = ckpt.token_logprobs(PROMPTS, RESPONSES)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
