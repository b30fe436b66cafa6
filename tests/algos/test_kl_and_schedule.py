"""Issue 38: the KL penalty's estimators (verl's ``kl_loss_type``) and the learning-rate schedules, worked by hand."""
from __future__ import annotations

import math

import pytest
import torch

from graft.algos.losses import kl_loss, kl_penalty
from graft.registry import KL_ESTIMATORS, LR_SCHEDULES
from graft.policy.optim import scheduled_lr

LN2 = math.log(2.0)


def _pair(pairs):
    """logp, ref_logp [B,T] from (p, p_ref) probabilities."""
    logp = torch.tensor([[math.log(p) for p, _ in row] for row in pairs], dtype=torch.float64)
    ref = torch.tensor([[math.log(q) for _, q in row] for row in pairs], dtype=torch.float64)
    return logp, ref


@pytest.mark.parametrize("kind, expected", [
    # d = log .5 - log .25 = ln 2 = 0.693147, then d = -ln 2
    ("k1", [LN2, -LN2]), ("kl", [LN2, -LN2]),
    # d^2 / 2 = 0.480453 / 2 = 0.240227 both ways
    ("k2", [0.240227, 0.240227]), ("mse", [0.240227, 0.240227]),
    # exp(-d) + d - 1: 0.5 + 0.693147 - 1 = 0.193147;  2 - 0.693147 - 1 = 0.306853
    ("k3", [0.193147, 0.306853]), ("low_var_kl", [0.193147, 0.306853]),
    ("abs", [LN2, LN2]),
])
def test_kl_penalty_by_hand(kind, expected):
    logp, ref = _pair([[(0.5, 0.25), (0.25, 0.5)]])
    torch.testing.assert_close(kl_penalty(logp, ref, kind), torch.tensor([expected], dtype=torch.float64),
                               rtol=0, atol=1e-6)


def test_every_config_choice_is_an_estimator():
    logp, ref = _pair([[(0.5, 0.25)]])
    for kind in KL_ESTIMATORS:
        assert kl_penalty(logp, ref, kind).shape == (1, 1)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(logp, ref, "k4")


def test_k3_is_clamped():
    # d = ln(1e-13 / 0.5) = -29.2, clamped to -20: exp(20) - 20 - 1 = 4.85e8, clamped to 10
    logp, ref = _pair([[(1e-13, 0.5)]])
    assert float(kl_penalty(logp, ref, "k3")) == 10.0


def test_kl_loss_aggregates_like_the_policy_loss():
    # row 0: d = ln2, -ln2 -> k3 0.193147, 0.306853; row 1: d = ln2 -> 0.193147, second token masked (NaN there)
    logp, ref = _pair([[(0.5, 0.25), (0.25, 0.5)], [(0.5, 0.25), (0.5, 0.5)]])
    logp[1, 1] = float("nan")
    logp.requires_grad_(True)
    mask = torch.tensor([[True, True], [True, False]])
    loss, m = kl_loss(logp, ref, mask, "k3", "token-mean")
    # (0.193147 + 0.306853 + 0.193147) / 3 = 0.693147 / 3 = 0.231049
    assert float(loss.detach()) == pytest.approx(0.231049, abs=1e-6)
    assert m["sum/kl"] == pytest.approx(0.693147, abs=1e-6) and m["tokens/kl"] == 3
    assert m["kl"] == pytest.approx(0.231049, abs=1e-6)
    loss.backward()
    # d/dd (exp(-d) + d - 1) = 1 - exp(-d): 0.5 at d = ln2, -1 at d = -ln2; each / 3 tokens
    torch.testing.assert_close(logp.grad, torch.tensor([[0.5 / 3, -1 / 3], [0.5 / 3, 0.0]], dtype=torch.float64))
    seq, _ = kl_loss(logp.detach(), ref, mask, "k3", "seq-mean-token-mean")
    # rows: (0.193147 + 0.306853) / 2 = 0.25 and 0.193147; mean 0.221574
    assert float(seq) == pytest.approx(0.221574, abs=1e-6)
    # global counts of a larger minibatch: 0.693147 / 6
    part, _ = kl_loss(logp.detach(), ref, mask, "k3", "token-mean", num_tokens=6.0)
    assert float(part) == pytest.approx(0.115525, abs=1e-6)


def test_kl_loss_checks_shapes():
    logp, ref = _pair([[(0.5, 0.25)]])
    with pytest.raises(AssertionError, match=r"\[B,T\]"):
        kl_loss(logp, ref[0], torch.ones(1, 1, dtype=torch.bool))
    with pytest.raises(AssertionError, match="mask"):
        kl_loss(logp, ref, torch.ones(2, 1, dtype=torch.bool))


@pytest.mark.parametrize("schedule, warmup, steps, expected", [
    # warm-up 2 of 6: 1/2, 2/2; then p = (k - 3) / 4 = 0, 1/4, 2/4, 3/4
    ("linear", 2, 6, [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]),
    # (1 + cos(pi p)) / 2: 1, (1 + 0.707107) / 2 = 0.853553, 0.5, (1 - 0.707107) / 2 = 0.146447
    ("cosine", 2, 6, [0.5, 1.0, 1.0, 0.853553, 0.5, 0.146447]),
    ("constant", 4, 5, [0.25, 0.5, 0.75, 1.0, 1.0]),
    ("constant", 0, 3, [1.0, 1.0, 1.0]),
    # no warm-up, 4 steps: p = 0, 1/4, 2/4, 3/4
    ("linear", 0, 4, [1.0, 0.75, 0.5, 0.25]),
    # warm-up longer than the run: the run ends inside it
    ("cosine", 4, 2, [0.25, 0.5]),
])
def test_schedules_by_hand(schedule, warmup, steps, expected):
    got = [scheduled_lr(2e-6, schedule, warmup, k, steps) / 2e-6 for k in range(1, steps + 1)]
    assert got == pytest.approx(expected, abs=1e-6)


def test_constant_schedule_is_the_configured_lr_exactly():
    lr = 1e-6
    assert all(scheduled_lr(lr, "constant", 0, k, 10) is lr for k in range(1, 11))
    assert set(LR_SCHEDULES) == {"constant", "linear", "cosine"}
    with pytest.raises(ValueError, match="unknown learning-rate schedule"):
        scheduled_lr(1e-6, "step", 0, 2, 10)

