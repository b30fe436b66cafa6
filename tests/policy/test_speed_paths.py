"""Issue 39: the sampler's reused decode buffers, its entropy switch and the head's kept logits compute
exactly what the paths they replace computed (bit for bit: the same kernels on the same tensors)."""
from __future__ import annotations

import pytest
import torch

from graft.policy.decoding import HEAD_COLUMNS, DecodeBuffers
from graft.policy.policy import Policy
from graft.policy.sampling import SamplingParams
from graft.policy.scoring import HEAD_KEEP_BYTES, _HeadLogProb


@pytest.fixture(params=["llama", "gemma"])
def pol(request, tiny_llama_policy, tiny_gemma_policy):
    return tiny_llama_policy if request.param == "llama" else tiny_gemma_policy


def _prompts(pol: Policy) -> list[list[int]]:
    return [pol.codec.encode_prompt("What is 2 + 3?"), pol.codec.encode_prompt("Compute 12 * 12 - 7, step by step.")]


def _generate(pol: Policy, reuse: bool, entropy: bool = True, **kw) -> list:
    pol.sampler.decode_buffers = reuse
    try:
        out = pol.generate(_prompts(pol), SamplingParams(n=3, max_new_tokens=12, batch_size=4, entropy=entropy, **kw))
    finally:
        pol.sampler.decode_buffers = True
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


def test_decode_buffers_take_the_head_as_is_while_a_gradient_is_recorded():
    lin, h = torch.nn.Linear(4, 7), torch.randn(5, 4)
    assert torch.equal(DecodeBuffers().logits(lin, h), lin(h))


def _padded_product(lin: torch.nn.Linear, h: torch.Tensor) -> torch.Tensor:
    """``W @ x.T`` over ``h`` [b, H] with zero rows up to a multiple of HEAD_COLUMNS, its first b columns as [b, V]."""
    x = torch.zeros(-(-h.shape[0] // HEAD_COLUMNS) * HEAD_COLUMNS, h.shape[1])
    x[: h.shape[0]] = h
    zt = torch.mm(lin.weight, x.t()) if lin.bias is None else torch.addmm(lin.bias[:, None], lin.weight, x.t())
    return zt[:, : h.shape[0]].t()


@torch.no_grad()
@pytest.mark.parametrize("bias", [False, True])
def test_decode_buffers_compute_a_linear_head_transposed_over_padded_columns(bias):
    # z[r, v] = sum_k h[r, k] * W[v, k] (+ b[v]) whichever operand BLAS streams: W @ x.T, x = h and zero rows
    lin = torch.nn.Linear(64, 300, bias=bias)
    bufs = DecodeBuffers()
    for rows in (1, 2, 5, 16, 9, 40, 12, 11, 32):  # growing and shrinking through the reused buffers
        h = torch.randn(rows, 64)
        z = bufs.logits(lin, h)
        assert z.shape == (rows, 300) and z.is_contiguous()
        assert torch.equal(z, _padded_product(lin, h))  # bit for bit: the same kernel on the same operands
        torch.testing.assert_close(z, lin(h), rtol=1e-5, atol=1e-6)
        assert torch.equal(DecodeBuffers(reuse=False).logits(lin, h), z)
    one = torch.nn.Linear(2, 2, bias=False)
    one.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    # rows [1, 1] and [2, 0] (padded with 14 zero rows): [1 + 2, 3 + 4] and [2, 6]
    assert bufs.logits(one, torch.tensor([[1.0, 1.0], [2.0, 0.0]])).tolist() == [[3.0, 7.0], [2.0, 6.0]]


@torch.no_grad()
@pytest.mark.parametrize("shape", [(300, 64), (49152, 32)])  # tiny SmolLM2's head
def test_a_rows_logits_do_not_depend_on_how_many_rows_are_alive(shape):
    # what the Ray backend's split sampling relies on: row r's logits from a batch of b rows, for every b, are the
    # logits of the full batch (with the exact row count, BLAS rounds differently below 12 rows on an AMD EPYC)
    torch.manual_seed(0)
    lin = torch.nn.Linear(shape[1], shape[0], bias=False)
    h = torch.randn(40, shape[1])
    full = DecodeBuffers().logits(lin, h).clone()
    bufs = DecodeBuffers()
    for rows in range(40, 0, -1):  # the batch shrinking as rows finish, through the reused buffers
        assert torch.equal(bufs.logits(lin, h[:rows]), full[:rows]), rows


def _head_grads(pol: Policy, keep_bytes: int, temperature: float) -> tuple:
    P = _prompts(pol)
    R = [pol.codec.encode_response(t, finished=True) for t in (" 2 + 3 = 5, so \\boxed{5}.", " It is 137, I think.")]
    pol.scorer.head_keep_bytes = keep_bytes
    pol.model.zero_grad(set_to_none=True)
    try:
        logp, mask = pol.forward_logprobs(P, R, chunk=5, temperature=temperature)
        (logp * mask * torch.linspace(-1, 2, logp.numel()).view_as(logp)).sum().backward()
    finally:
        pol.scorer.head_keep_bytes = HEAD_KEEP_BYTES
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


def test_accumulating_head_adds_its_weight_gradient_in_place_hand_worked():
    # h = [1, 0], W = 0 (2 x 2): logits [0, 0], softmax [0.5, 0.5]; target 0 -> logp = -ln 2 and
    # d logp / dz = onehot - softmax = [0.5, -0.5], so dW = dz^T h = [[0.5, 0], [-0.5, 0]]. With ones already
    # in W.grad the head adds it there: [[1.5, 1], [0.5, 1]]; autograd receives no second copy of it.
    h = torch.tensor([[1.0, 0.0]], requires_grad=True)
    w = torch.zeros(2, 2, requires_grad=True)
    w.grad = torch.ones(2, 2)
    out = _HeadLogProb.apply(h, w, None, torch.tensor([0]), None, 1.0, True, None, True)
    assert torch.allclose(out, torch.tensor([-0.6931472]))
    out.sum().backward()
    assert torch.equal(w.grad, torch.tensor([[1.5, 1.0], [0.5, 1.0]]))
    assert torch.equal(h.grad, torch.zeros(1, 2))  # dh = dz W = 0


def _two_microbatch_grads(pol: Policy, accumulate: bool) -> tuple:
    """Gradients after two backward passes into the same ``.grad`` (two micro-batches), and whether the tied
    embedding ran sparse."""
    P = _prompts(pol)
    R = [pol.codec.encode_response(t, finished=True) for t in (" 2 + 3 = 5, so \\boxed{5}.", " It is 137, I think.")]
    pol.scorer.accumulate_head_grad = accumulate
    pol.model.zero_grad(set_to_none=True)
    try:
        for rows in ([0, 1], [1]):
            logp, mask = pol.forward_logprobs([P[i] for i in rows], [R[i] for i in rows], chunk=5)
            (logp * mask * torch.linspace(-1, 2, logp.numel()).view_as(logp)).sum().backward()
        tied = pol.scorer._tied_embedding()
        sparse = tied is not None and tied.sparse
    finally:
        pol.scorer.accumulate_head_grad = True
    grads = tuple(p.grad.clone() for p in pol.trainable_parameters())
    pol.model.zero_grad(set_to_none=True)
    return grads, sparse


def _assert_same_gradients(new: tuple, old: tuple) -> None:
    assert all(not g.is_sparse for g in new)
    for a, b in zip(new, old, strict=True):  # another order of float additions, nothing else
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), (a - b).abs().max()


def test_accumulated_head_and_sparse_tied_embedding_give_autograds_gradients(pol):
    (new, sparse_on), (old, sparse_off) = _two_microbatch_grads(pol, True), _two_microbatch_grads(pol, False)
    assert sparse_on and not sparse_off  # both tiny models tie the head to the input embedding
    _assert_same_gradients(new, old)


def test_an_untied_head_accumulates_and_its_embedding_stays_dense(tiny_llama_dir):
    from graft.config import ModelConfig

    pol = Policy.load(ModelConfig(name="A", path=tiny_llama_dir, template="plain"))
    head = pol._head
    head.weight = torch.nn.Parameter(head.weight.detach().clone())
    assert pol.scorer._tied_embedding() is None
    (new, sparse_on), (old, _) = _two_microbatch_grads(pol, True), _two_microbatch_grads(pol, False)
    assert not sparse_on and not pol.model.get_input_embeddings().sparse
    _assert_same_gradients(new, old)


def test_no_accumulation_under_autocast_or_without_gradients(tiny_gemma_dir):
    from graft.config import ModelConfig

    pol = Policy.load(ModelConfig(name="B", path=tiny_gemma_dir, template="plain", autocast="bfloat16"))
    assert not pol.scorer._accumulates_head_grad()  # the bf16 copy's gradient is cast back: autograd adds it
    with torch.no_grad():
        assert not Policy.load(ModelConfig(name="B", path=tiny_gemma_dir, template="plain")).scorer._accumulates_head_grad()
