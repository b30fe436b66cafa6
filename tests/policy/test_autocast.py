"""``models.I.autocast: bfloat16``: the log-prob forwards in bf16 over fp32 weights (mixed precision).

Pinned: the fused head computes with the bf16 copy it is given (its log-probs equal the fp32 function on bf16-rounded
inputs up to summation order, not the fp32 ones) and returns fp32 gradients to the fp32 parameters; a whole
``forward_logprobs`` under autocast stays within a stated distance of fp32 in log-probs and gradients, while really
computing in bf16; the head's bf16 copy follows the weights after an in-place change; off, nothing changes (the
pinned-pair test); a run with it trains, its update's first ratio against the recomputed log-probs at 1.
"""
from __future__ import annotations

import math

import pytest
import torch

from graft.policy.policy import Policy
from graft.policy.scoring import _HeadLogProb
from graft.trainer import loop
from tests.trainer.helpers import crafted_rewards, params, tiny_config

BF16 = torch.bfloat16


def _round(x: torch.Tensor) -> torch.Tensor:
    return x.to(BF16).float()


@pytest.mark.parametrize("softcap, temperature, keep", [(None, 1.0, True), (None, 0.7, False), (5.0, 1.0, True)])
def test_fused_head_computes_with_the_bf16_copy_and_returns_fp32_gradients(softcap, temperature, keep):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(6, 16, generator=g, requires_grad=True)
    w = torch.randn(50, 16, generator=g, requires_grad=True)
    b = torch.randn(50, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (6,), generator=g)
    up = torch.linspace(-1, 2, 6)

    out = _HeadLogProb.apply(h, w, b, targets, softcap, temperature, keep, w.detach().to(BF16))
    (out * up).sum().backward()
    got = (out.detach(), h.grad.clone(), w.grad.clone(), b.grad.clone())
    assert out.dtype == torch.float32 and all(t.dtype == torch.float32 for t in got[1:])

    def reference(hh, ww, bb, bf16_logits=False):
        z = torch.nn.functional.linear(hh, ww, bb)
        z = _round(z) if bf16_logits else z
        if softcap:
            z = torch.tanh(z / softcap) * softcap
        return torch.log_softmax(z / temperature, -1).gather(-1, targets[:, None]).squeeze(-1)

    # the forward is the fp32 function of the bf16-rounded inputs with the bf16 matmul's logits rounded to bf16
    # (bf16 x bf16 products are exact in fp32; only the summation order differs, which on another CPU's kernel can
    # round one logit to the neighbouring bf16 value: one row may differ by that much)
    ref = reference(*(_round(t.detach()) for t in (h, w, b)), bf16_logits=True)
    gap = (out.detach() - ref).abs()
    assert int((gap <= 1e-5).sum()) >= len(gap) - 1 and float(gap.max()) < 0.1, gap
    exact = reference(h.detach(), w.detach(), b.detach())
    assert (out.detach() - exact).abs().max() > 1e-4  # and not the fp32 one: the copy was used
    # gradients: the bf16-rounded dlogits (relative 2^-8) through bf16 matmuls, so within a few percent of fp32
    hh, ww, bb = (t.detach().clone().requires_grad_() for t in (h, w, b))
    (reference(hh, ww, bb) * up).sum().backward()
    for mine, theirs in zip(got[1:], (hh.grad, ww.grad, bb.grad)):
        assert (mine - theirs).norm() <= 0.03 * theirs.norm()


def _logprobs_and_grads(pol: Policy, autocast: torch.dtype | None, fused: bool = True) -> tuple:
    P = [pol.codec.encode_prompt("What is 2 + 3?"), pol.codec.encode_prompt("Compute 12 * 12 - 7, step by step.")]
    R = [pol.codec.encode_response(t, finished=True) for t in (" 2 + 3 = 5, so \\boxed{5}.", " It is 137, I think.")]
    pol.autocast, pol.scorer.fused_head = autocast, fused
    pol.model.zero_grad(set_to_none=True)
    try:
        logp, mask = pol.forward_logprobs(P, R, chunk=5)
        (logp * mask * torch.linspace(-1, 2, logp.numel()).view_as(logp)).sum().backward()
    finally:
        pol.autocast, pol.scorer.fused_head = None, True
    grads = [p.grad.clone() for p in pol.trainable_parameters()]
    pol.model.zero_grad(set_to_none=True)
    return logp.detach()[mask.bool()], grads


@pytest.mark.parametrize("which", ["llama", "gemma"])
@pytest.mark.parametrize("fused", [True, False])
def test_autocast_logprobs_and_gradients_are_within_tolerance_of_fp32(which, fused, request):
    pol = request.getfixturevalue(f"tiny_{which}_policy")
    lp32, g32 = _logprobs_and_grads(pol, None)
    lp16, g16 = _logprobs_and_grads(pol, BF16, fused)
    gap = (lp16 - lp32).abs()
    assert float(gap.max()) < 0.05 and float(gap.max()) > 1e-4  # close, and really computed in bf16
    assert all(g.dtype == torch.float32 for g in g16) and len(g16) == len(g32)
    total32 = torch.sqrt(sum(g.square().sum() for g in g32))
    total_gap = torch.sqrt(sum((a - b).square().sum() for a, b in zip(g16, g32)))
    assert total_gap <= 0.05 * total32, (float(total_gap), float(total32))


def test_the_heads_bf16_copy_follows_an_in_place_weight_change(tiny_llama_policy):
    pol = tiny_llama_policy
    w = pol.model.get_output_embeddings().weight
    pol.autocast = BF16
    try:
        first = pol.scorer._compute_copy(w)
        assert pol.scorer._compute_copy(w) is first  # one copy while the weight is unchanged
        with torch.no_grad():
            w.mul_(1.5)
        again = pol.scorer._compute_copy(w)
        assert again is not first and torch.equal(again, w.detach().to(BF16))
        with torch.no_grad():
            w.div_(1.5)
    finally:
        pol.autocast, pol.scorer._compute = None, None


def test_a_run_with_autocast_trains_and_its_first_ratio_is_one(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    """One minibatch per step: every ratio is taken before the step's optimiser step, against the recomputed
    behaviour log-probs of the same bf16 forward, so it is 1 up to the forwards' batching (bf16 rounding)."""
    crafted_rewards(monkeypatch)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "update.recompute_old_logprobs=true",
                      "models.0.autocast=bfloat16", "models.1.autocast=bfloat16", "update.num_minibatches=1")
    run = loop.setup(cfg)
    try:
        assert all(lr.workers.worker.policy.autocast is BF16 for lr in run.learners.values())
        before = params(run)
        rows = [loop.train_step(run, step) for step in (1, 2)]
        after = params(run)
    finally:
        loop.close_run(run)
    assert all(after[k].dtype == torch.float32 for k in after)
    assert sum(not torch.equal(before[k], after[k]) for k in before) > len(before) // 2  # both models trained
    for r in rows:
        for m in ("A", "B"):
            assert math.isfinite(r[f"{m}/loss"]) and r[f"{m}/grad_norm"] > 0
            assert abs(r[f"{m}/ratio/mean"] - 1) < 0.02 and r[f"{m}/ratio/max"] < 1.2, r
            assert 0 < r[f"{m}/logprob_gap/mean_abs"] < 0.05  # the fp32 sampler against the bf16 recompute
