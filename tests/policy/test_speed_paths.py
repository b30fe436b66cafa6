"""Issue 39: the sampler's reused decode buffers, its entropy switch and the head's kept logits compute
exactly what the paths they replace computed (bit for bit: the same kernels on the same tensors)."""
from __future__ import annotations

import pytest
import torch

from graft.policy.policy import DecodeBuffers, Policy, _HeadLogProb


@pytest.fixture(params=["llama", "gemma"])
def pol(request, tiny_llama_policy, tiny_gemma_policy):
    return tiny_llama_policy if request.param == "llama" else tiny_gemma_policy


def _prompts(pol: Policy) -> list[list[int]]:
    return [pol.codec.encode_prompt("What is 2 + 3?"), pol.codec.encode_prompt("Compute 12 * 12 - 7, step by step.")]


def _generate(pol: Policy, reuse: bool, entropy: bool = True, **kw) -> list:
    pol.decode_buffers = reuse
    try:
        out = pol.generate(_prompts(pol), n=3, max_new_tokens=12, batch_size=4, entropy=entropy, **kw)
    finally:
        pol.decode_buffers = True
    return [(s.token_ids, s.logprobs, s.entropies, s.finished) for g in out for s in g]


@pytest.mark.parametrize("kw", [{}, {"temperature": 0.7, "top_p": 0.9}, {"seeds": [11, 12]}])
def test_reused_decode_buffers_sample_exactly_what_fresh_tensors_sample(pol, kw):
    assert _generate(pol, reuse=True, seed=3, **kw) == _generate(pol, reuse=False, seed=3, **kw)


def test_entropy_off_changes_no_token_and_no_logprob(pol):
    on, off = _generate(pol, reuse=True, seed=5), _generate(pol, reuse=True, entropy=False, seed=5)
    assert [(t, lp, f) for t, lp, _, f in on] == [(t, lp, f) for t, lp, _, f in off]
    assert all(e is None for _, _, e, _ in off) and all(len(e) == len(t) for t, _, e, _ in on)


@torch.no_grad()
def test_decode_buffers_fall_back_for_a_head_they_do_not_know():
    head = torch.nn.Linear(4, 7).to(torch.float64)
    h = torch.randn(3, 4, dtype=torch.float64)
    assert torch.equal(DecodeBuffers().logits(head, h), head(h).float())
    bufs, lin = DecodeBuffers(), torch.nn.Linear(4, 7)
    h32 = torch.randn(5, 4)
    assert torch.equal(bufs.logits(lin, h32), lin(h32)) and torch.equal(bufs.logits(lin, h32[:2]), lin(h32[:2]))


def _head_grads(pol: Policy, keep_bytes: int, temperature: float) -> tuple:
    P = _prompts(pol)
    R = [pol.codec.encode_response(t, finished=True) for t in (" 2 + 3 = 5, so \\boxed{5}.", " It is 137, I think.")]
    pol.head_keep_bytes = keep_bytes
    pol.model.zero_grad(set_to_none=True)
    try:
        logp, mask = pol.forward_logprobs(P, R, chunk=5, temperature=temperature)
        (logp * mask * torch.linspace(-1, 2, logp.numel()).view_as(logp)).sum().backward()
    finally:
        pol.head_keep_bytes = Policy.__init__.__globals__["HEAD_KEEP_BYTES"]
    grads = tuple(p.grad.clone() for p in pol.trainable_parameters())
    pol.model.zero_grad(set_to_none=True)
    return logp.detach(), grads


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_kept_head_logits_give_the_recomputed_gradients_bit_for_bit(pol, temperature):
    V = pol._head.weight.shape[0]
    old = _head_grads(pol, 0, temperature)
    for budget in (1 << 40, 4 * 5 * V):   # every chunk kept; only the first chunk kept (the rest recomputed)
        new = _head_grads(pol, budget, temperature)
        assert torch.equal(new[0], old[0])
        assert all(torch.equal(a, b) for a, b in zip(new[1], old[1], strict=True))


def test_kept_head_logits_refuse_a_second_backward():
    h, w = torch.randn(3, 4, requires_grad=True), torch.randn(6, 4, requires_grad=True)
    out = _HeadLogProb.apply(h, w, None, torch.tensor([0, 5, 2]), 30.0, 1.0, True).sum()
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="inplace"):
        out.backward()
