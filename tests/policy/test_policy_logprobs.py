"""Chunked log-probs of given responses: chunk invariance, padding invariance, gradients."""
from __future__ import annotations

import pytest
import torch

from graft.config import ModelConfig
from graft.policy.policy import Policy


@pytest.fixture(params=["llama", "gemma"])
def pol(request, tiny_llama_policy, tiny_gemma_policy):
    return tiny_llama_policy if request.param == "llama" else tiny_gemma_policy


def _batch(pol):
    prompts = [pol.codec.encode_prompt("What is 2 + 3?"), pol.codec.encode_prompt("Compute 12 * 12 - 7, carefully and step by step.")]
    texts = [" 2 + 3 = 5, so \\boxed{5}.", " It is 137.", " Let me think about this for a while: 144 - 7 = 137.", ""]
    P = [prompts[0], prompts[1], prompts[1], prompts[0]]
    R = [pol.codec.encode_response(t, finished=i % 2 == 0) for i, t in enumerate(texts)]
    return P, R


def _reference(pol, P, R):
    """Unchunked, unbatched: full logits of one sequence at a time."""
    out = []
    for p, r in zip(P, R):
        if not r:
            out.append(torch.zeros(0))
            continue
        ids = torch.tensor([p + r])
        h = pol._decoder(input_ids=ids).last_hidden_state[0]
        lp = torch.log_softmax(pol._logits(h, 1.0), -1)
        out.append(lp[len(p) - 1:-1].gather(-1, torch.tensor(r)[:, None]).squeeze(-1))
    return out


@torch.no_grad()
def test_chunk_sizes_agree(pol):
    P, R = _batch(pol)
    res = [pol.forward_logprobs(P, R, chunk=c) for c in (1, 7, 1024)]
    T = max(len(r) for r in R)
    for logp, mask in res:
        assert logp.shape == mask.shape == (len(R), T)
        assert mask.sum().item() == sum(len(r) for r in R)
        assert (logp[mask == 0] == 0).all() and (logp[mask == 1] < 0).all()
    for logp, _ in res[1:]:   # values ~ -13: fp32 spacing there is ~1e-6, and chunking changes matmul shapes
        assert (logp - res[0][0]).abs().max().item() < 1e-5


@torch.no_grad()
def test_matches_unbatched_reference(pol):
    P, R = _batch(pol)
    logp, mask = pol.forward_logprobs(P, R, chunk=3)
    for b, ref in enumerate(_reference(pol, P, R)):
        assert torch.allclose(logp[b, :len(R[b])], ref, atol=1e-5)
        assert mask[b, :len(R[b])].all() and not mask[b, len(R[b]):].any()


@torch.no_grad()
def test_temperature(pol):
    P, R = _batch(pol)
    l1, m = pol.forward_logprobs(P, R)
    l2, _ = pol.forward_logprobs(P, R, temperature=0.5)
    assert not torch.allclose(l1[m == 1], l2[m == 1])


def test_token_logprobs_order_and_values(pol):
    P, R = _batch(pol)
    P, R = P + P[::-1], R + R[::-1]
    outs = pol.token_logprobs(P, R, chunk=4, micro_batch=3, progress=True)
    assert [o.shape[0] for o in outs] == [len(r) for r in R]
    for o, ref in zip(outs, _reference(pol, P, R)):
        assert o.dtype == torch.float32 and not o.requires_grad
        assert torch.allclose(o, ref, atol=1e-5)


def _grads(pol, fn):
    pol.model.zero_grad()
    fn().backward()
    return {n: p.grad.clone() for n, p in pol.model.named_parameters() if p.grad is not None}


def _assert_same_grads(a, b):
    assert a.keys() == b.keys()
    for n in a:  # equal up to fp32 summation order
        assert torch.allclose(a[n], b[n], rtol=1e-3, atol=1e-4 * a[n].abs().max().item()), n


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_gradients_match_plain_autograd(tiny_gemma_dir, temperature):
    """Fused head backward, checkpointed chunks and plain autograd give the same gradients
    (tiny Gemma: tied embeddings and final-logit softcapping)."""
    pol = Policy.load(ModelConfig(path=tiny_gemma_dir, template="plain"))
    P, R = _batch(pol)

    def reference():
        total = 0
        for p, r in zip(P, R):
            if r:
                h = pol._decoder(input_ids=torch.tensor([p + r])).last_hidden_state[0]
                lp = torch.log_softmax(pol._logits(h, temperature), -1)
                total = total + lp[len(p) - 1:-1].gather(-1, torch.tensor(r)[:, None]).sum()
        return total

    def ours(chunk):
        def f():
            logp, mask = pol.forward_logprobs(P, R, chunk=chunk, temperature=temperature)
            assert logp.requires_grad
            return (logp * mask).sum()
        return f

    ref = _grads(pol, reference)
    assert len(ref) == sum(1 for _ in pol.model.parameters())
    _assert_same_grads(ref, _grads(pol, ours(3)))
    _assert_same_grads(ref, _grads(pol, ours(4096)))
    pol.scorer.fused_head = False  # the checkpointed path (used for LoRA-wrapped or sharded heads)
    _assert_same_grads(ref, _grads(pol, ours(5)))


def test_gradients_lora_frozen_head(tiny_llama_dir):
    from graft.config import LoraConfig
    pol = Policy.load(ModelConfig(path=tiny_llama_dir, template="plain", lora=LoraConfig(enabled=True, r=2, alpha=4)))
    P, R = _batch(pol)
    with torch.no_grad():  # a non-zero adapter, so gradients reach lora_A too
        for n, p in pol.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    f = lambda: (lambda lm: (lm[0] * lm[1]).sum())(pol.forward_logprobs(P, R, chunk=4))  # noqa: E731
    fused = _grads(pol, f)
    assert fused and all("lora_" in n for n in fused)
    pol.scorer.fused_head = False
    _assert_same_grads(fused, _grads(pol, f))


def test_empty_and_errors(pol):
    logp, mask = pol.forward_logprobs([[1, 2]], [[]])
    assert logp.shape == (1, 0) and mask.shape == (1, 0)
    assert pol.token_logprobs([], []) == []
    with pytest.raises(ValueError):
        pol.forward_logprobs([[1]], [[2], [3]])
    with pytest.raises(ValueError):
        pol.forward_logprobs([[]], [[3]])
