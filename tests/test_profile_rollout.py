"""graft bench rollout-profile (graft.bench.rollout_profile): operators are attributed to the right part of a rollout."""
import pytest

from graft.bench import rollout_profile as prof

V = 49152


@pytest.mark.parametrize("name,shapes,part", [
    ("aten::mm", [[32, 576], [576, V]], "lm_head"),             # logits of 32 rows
    ("aten::_log_softmax", [[32, V], []], "lm_head"),           # a sampling op over the vocabulary
    ("aten::mm", [[32, 576], [576, 1536]], "body_matmuls"),     # an MLP projection
    ("aten::addmm", [[576], [32, 576], [576, 576]], "body_matmuls"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", [[4, 9, 32, 64]] * 3, "attention"),
    ("aten::mul", [[32, 1, 576], [576]], "other_ops"),
    ("aten::mul", [[32, 1, 576], []], "other_ops"),
])
def test_classify(name, shapes, part):
    assert prof.classify(name, shapes, V) == part


def test_breakdown_parts_add_up_to_the_wall_clock():
    import torch

    w = torch.randn(64, V)

    def fn():
        h = torch.randn(8, 64)
        torch.log_softmax(h @ w, -1)
        (h @ torch.randn(64, 64)).relu()
        return 8

    r = prof.breakdown(fn, V)
    assert r["tokens"] == 8 and set(r["seconds"]) == set(prof.PARTS)
    assert sum(r["seconds"].values()) >= r["wall_s"] - 1e-9 and r["seconds"]["outside_ops"] >= 0   # nothing lost
    assert r["seconds"]["lm_head"] > 0 and r["seconds"]["body_matmuls"] > 0


def test_the_update_phase_runs_forward_and_backward_over_every_response(tiny_llama_dir):
    """3 responses of 2 + 3 + 1 tokens in micro-batches of 2: 6 tokens, and the gradient is that of the mean
    token log-prob over the 3 rows (summed over micro-batches, as in a minibatch)."""
    from types import SimpleNamespace

    import torch

    from graft.config import load_config
    from tests.conftest import _policy

    cfg = load_config("configs/default.yaml", ["update.micro_batch_size=2"])
    pol = _policy(tiny_llama_dir, "A")
    groups = [SimpleNamespace(prompt_token_ids=[1, 5, 9], token_ids=[[21, 22], [23, 24, 25]]),
              SimpleNamespace(prompt_token_ids=[1, 7], token_ids=[[40], []])]          # an empty response is skipped
    assert prof._forward_backward(pol, groups, cfg) == 6
    got = {n: p.grad.clone() for n, p in pol.model.named_parameters()}
    assert not pol.model.training                                                        # back to eval after
    pol.model.zero_grad(set_to_none=True)
    logp, mask = pol.forward_logprobs([[1, 5, 9], [1, 5, 9], [1, 7]], [[21, 22], [23, 24, 25], [40]])
    ((logp * mask).sum() / 3).backward()
    for n, p in pol.model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-4, atol=1e-5 * p.grad.abs().max().item(), msg=n)


def test_a_phase_without_tokens_has_no_rate():
    part = dict.fromkeys(prof.PARTS, 0.5)
    row = {"wall_s": 2.5, "tokens": 0, "seconds": part, "share": dict.fromkeys(prof.PARTS, 0.2)}
    result = {"settings": {"threads": 2, "prompts": 1, "n": 2, "max_new_tokens": 4}, "environment": {},
              "models": {"m": {"name": "m", "vocab": 7, **{ph: {**row, "tokens": 10} for ph in prof.PHASES},
                               "adamw_step": row}}}
    md = prof.markdown(result)
    assert "| m (V=7) | adamw_step | 2.50 | – | 0.50 (20 %) |" in md
    assert "| m (V=7) | update_fwd_bwd | 2.50 | 4.0 | " in md
