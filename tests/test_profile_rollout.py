"""scripts/profile_rollout.py (graft.bench.rollout_profile): operators are attributed to the right part of a rollout."""
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
