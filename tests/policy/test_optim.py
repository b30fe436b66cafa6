"""LeanAdamW equals torch's AdamW bit for bit, and its state_dict is interchangeable with torch's."""
import copy

import pytest
import torch

from graft.policy import optim
from graft.policy.optim import LeanAdamW


def _params(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]


def _grads(params, step, seed=1):
    g = torch.Generator().manual_seed(seed * 1000 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 10 ** -(step % 3)


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_equals_torch_adamw_bitwise_across_chunk_boundaries(monkeypatch, wd):
    # CHUNK = 1000 elements: a 3001-element tensor is updated in 4 slices (1000, 1000, 1000, 1), a
    # 7 x 143 = 1001-element one in 2; the 10-element one at once. Every value must be identical.
    monkeypatch.setattr(optim, "CHUNK", 1000)
    shapes = [(3001,), (7, 143), (10,), (2, 500)]
    ours, ref = _params(shapes), _params(shapes)
    opt = LeanAdamW(ours, lr=1e-3, betas=(0.9, 0.95), weight_decay=wd)
    opt_ref = torch.optim.AdamW(ref, lr=1e-3, betas=(0.9, 0.95), weight_decay=wd)
    for step in range(5):
        _grads(ours, step), _grads(ref, step)
        opt.step(), opt_ref.step()
        for a, b in zip(ours, ref):
            assert torch.equal(a, b)
    for a, b in zip(ours, ref):
        sa, sb = opt.state[a], opt_ref.state[b]
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
        assert sa["step"].dtype == sb["step"].dtype and float(sa["step"]) == float(sb["step"]) == 5


def test_state_dict_round_trips_with_torch_adamw(monkeypatch):
    # train 2 steps with torch's AdamW, continue with LeanAdamW from its state_dict, and compare
    # with torch's AdamW continuing: identical (resume from checkpoints written before LeanAdamW).
    monkeypatch.setattr(optim, "CHUNK", 64)
    shapes = [(300,), (9, 11)]
    a, b = _params(shapes), _params(shapes)
    oa = torch.optim.AdamW(a, lr=3e-3)
    ob = torch.optim.AdamW(b, lr=3e-3)
    for step in range(2):
        _grads(a, step), _grads(b, step)
        oa.step(), ob.step()
    lean = LeanAdamW(a, lr=3e-3)
    lean.load_state_dict(oa.state_dict())
    for step in range(2, 4):
        _grads(a, step), _grads(b, step)
        lean.step(), ob.step()
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert set(lean.state_dict()["state"][0]) == set(ob.state_dict()["state"][0])


def test_unsupported_flags_fall_back_to_torch():
    a, b = _params([(50,)]), _params([(50,)])
    oa, ob = LeanAdamW(a, lr=1e-2, amsgrad=True), torch.optim.AdamW(b, lr=1e-2, amsgrad=True)
    for step in range(3):
        _grads(a, step), _grads(b, step)
        oa.step(), ob.step()
    assert torch.equal(a[0], b[0])


def test_skips_parameters_without_gradient():
    a = _params([(20,), (20,)])
    before = a[1].detach().clone()
    opt = LeanAdamW(a, lr=1e-2)
    a[0].grad = torch.ones(20)
    opt.step()
    assert torch.equal(a[1], before) and a[1] not in opt.state


def _train(opt, params, steps):
    for step in steps:
        _grads(params, step)
        opt.step()


def test_make_adamw_takes_torchs_fused_kernel_for_plain_cpu_parameters():
    shapes = [(3001,), (7, 143)]
    ours, fused, single = _params(shapes), _params(shapes), _params(shapes)
    opt = optim.make_adamw(ours, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01)
    assert all(g["fused"] for g in opt.param_groups)
    _train(opt, ours, range(4))
    _train(torch.optim.AdamW(fused, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01, fused=True), fused, range(4))
    _train(torch.optim.AdamW(single, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01), single, range(4))
    assert all(torch.equal(a, b) for a, b in zip(ours, fused))  # torch's fused kernel itself
    for a, b in zip(ours, single):  # the same arithmetic as the single-tensor path, rounded another way
        assert torch.allclose(a, b, rtol=0, atol=1e-6)
    assert optim.make_adamw(_params([(3,)], seed=2)[:0] + [torch.nn.Parameter(torch.ones(3, device="meta"))],
                            lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0).param_groups[0]["fused"] is None


@pytest.mark.parametrize("first_fused", [True, False])
def test_a_checkpoint_resumes_with_this_processs_kernel(first_fused):
    # A state written by one kernel loads into an optimiser of the other: the moments and steps move, the
    # kernel choice stays (else a resumed run would silently take the other kernel). Continuing equals the
    # other kernel trained from that state.
    shapes = [(300,), (9, 11)]
    a, b = _params(shapes), _params(shapes)
    writer = LeanAdamW(a, lr=3e-3, fused=first_fused or None)
    _train(writer, a, range(2))
    with torch.no_grad():
        for x, y in zip(a, b):
            y.copy_(x)
    reader = LeanAdamW(a, lr=3e-3, fused=(not first_fused) or None)
    reader.load_state_dict(copy.deepcopy(writer.state_dict()))  # loading shares the saved tensors: one copy each
    assert reader.param_groups[0]["fused"] is ((not first_fused) or None)
    ref = torch.optim.AdamW(b, lr=3e-3, fused=not first_fused)
    ref.load_state_dict(copy.deepcopy(writer.state_dict()))
    ref.param_groups[0]["fused"] = (not first_fused) or None
    _train(reader, a, range(2, 4)), _train(ref, b, range(2, 4))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
