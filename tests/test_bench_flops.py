"""Model FLOPs per phase (graft/bench/flops.py): hand-worked counts, the sizes read off real model classes, and
the host's matmul rate."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from graft.bench.flops import ModelShape, matmul_peak_gflops, model_shape, phase_rates, rollout_flops, update_flops

SHAPE = ModelShape(body=10, hidden=2, vocab=5)


def test_rollout_flops_count_the_decoder_on_prompt_and_response_and_the_head_on_responses():
    # 2 * 10 * (3 + 4) = 140 through the decoder, 2 * 2 * 5 * 4 = 80 in the head
    assert rollout_flops(SHAPE, prompt_tokens=3, generated=4) == 220.0


def test_update_flops_are_three_forwards():
    # forward: 2 * 10 * 6 = 120 (decoder over the forwarded positions) + 2 * 2 * 5 * 4 = 80 (head on the trained
    # tokens); backward twice that: 3 * 200 = 600
    assert update_flops(SHAPE, forwarded=6, trained=4) == 600.0
    with pytest.raises(AssertionError):
        update_flops(SHAPE, forwarded=3, trained=4)   # a trained token is a forwarded position


def test_phase_rates_sum_the_models_and_divide_by_each_phase_time():
    m = {"A/tokens/prompt": 3, "A/tokens/generated": 4, "A/tokens/forwarded": 6, "A/tokens/update": 4,
         "B/tokens/prompt": 1, "B/tokens/generated": 1, "B/tokens/forwarded": 0, "B/tokens/update": 0,
         "time/rollout_s": 1e-7, "time/update_s": 2e-7, "time/step_s": 4e-7}
    other = ModelShape(body=1, hidden=1, vocab=1)
    r = phase_rates(m, {"A": SHAPE, "B": other})
    # rollout: 220 (A) + 2 * 1 * 2 + 2 * 1 * 1 * 1 = 6 (B) = 226 FLOPs; update: 600 (A) + 0 (B); step 826
    assert r["rollout_gflop"] == pytest.approx(226e-9) and r["update_gflop"] == pytest.approx(600e-9)
    assert r["step_gflop"] == pytest.approx(826e-9)
    assert r["rollout_gflops"] == pytest.approx(2.26) and r["update_gflops"] == pytest.approx(3.0)
    assert r["step_gflops"] == pytest.approx(826e-9 / 4e-7)
    assert phase_rates({}, {"A": SHAPE})["step_gflops"] is None   # no time: no rate


@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "tiny_gemma_dir"])
def test_model_shape_leaves_out_the_embedding_and_the_head(fixture, request):
    model = AutoModelForCausalLM.from_pretrained(request.getfixturevalue(fixture))
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    total = sum(p.numel() for p in model.parameters())   # a tied head is one parameter with the embedding
    s = model_shape(model)
    assert (s.vocab, s.hidden) == tuple(head.shape)
    assert s.body == total - emb.numel() - (0 if head is emb else head.numel()) > 0


def test_matmul_peak_is_a_positive_rate():
    torch.manual_seed(0)
    assert matmul_peak_gflops(n=64, seconds=0.05) > 0
