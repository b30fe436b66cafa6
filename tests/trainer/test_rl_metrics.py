"""The metrics RL users read (entropy, reward std, advantages, length range, GPU memory), the
completions the trackers get, and logs that read well when stderr is not a terminal."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graft.policy.decoding import entropy_of
from graft.policy.sampling import SamplingParams
from graft.trainer import loop, workers
from graft.trainer.learner import Learner, mean_entropy
from graft.trainer.metrics import completion_rows, console_line, group_stats, in_group_reward_stats, trl_aliases
from graft.types import RolloutGroup, Sample
from tests.trainer.helpers import crafted_rewards, tiny_config
from tests.patience import patient


REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- pure parts

def test_entropy_of_hand_worked():
    # p = (1/2, 1/4, 1/4): H = 1/2 ln 2 + 2 * 1/4 ln 4 = 1.5 ln 2 = 1.0397 nats
    z = torch.log(torch.tensor([[0.5, 0.25, 0.25], [1.0, 1.0, 1.0]]))
    z = z - z.amax(-1, keepdim=True)
    e = z.exp()
    before = (z.clone(), e.clone())
    assert entropy_of(z, e).tolist() == pytest.approx([1.5 * math.log(2), math.log(3)], abs=1e-6)
    assert torch.equal(z, before[0]) and torch.equal(e, before[1])      # inputs untouched
    # a -inf logit (probability 0) adds nothing: (0, -inf) -> H = 0; (0, 0, -inf) -> ln 2
    z = torch.tensor([[0.0, -math.inf, -math.inf], [0.0, 0.0, -math.inf]])
    assert entropy_of(z, z.exp()).tolist() == pytest.approx([0.0, math.log(2)], abs=1e-6)


def _group(rewards, advantages, lengths):
    G = len(rewards)
    return RolloutGroup(prompt_id="p", problem="q", answer="a", source="A", holder="A", prompt_text="q",
                        prompt_token_ids=[1], responses=[f"r{i}" for i in range(G)], token_ids=[[5] * n for n in lengths],
                        old_logprobs=[[0.0] * n for n in lengths], gen_token_ids=[[5] * n for n in lengths],
                        gen_logprobs=[[0.0] * n for n in lengths], finished=[True] * G, weights=[1.0] * G,
                        compat=[1.0] * G, rewards=list(rewards), status=["ok"] * G, advantages=list(advantages))


def test_group_stats_reward_std_advantages_and_length_range():
    gs = [_group([1.0, 0.0], [1.0, -1.0], [3, 7]), _group([0.0, 0.0], [0.0, 0.0], [2, 4])]
    st = group_stats(gs, 0.5)
    # rewards 1,0,0,0: mean 0.25, population variance (0.5625 + 3 * 0.0625) / 4 = 0.1875
    assert st["reward/mean"] == 0.25 and st["reward/std"] == pytest.approx(math.sqrt(0.1875))
    # advantages 1,-1,0,0: mean 0, variance (1 + 1) / 4 = 0.5
    assert st["advantage/mean"] == 0 and st["advantage/std"] == pytest.approx(math.sqrt(0.5))
    assert (st["advantage/min"], st["advantage/max"]) == (-1.0, 1.0)
    assert (st["response_length/min"], st["response_length/mean"], st["response_length/max"]) == (2, 4.0, 7)


def test_in_group_reward_std_is_trls_not_the_batch_spread():
    # the two groups above: rewards (1, 0) and (0, 0). TRL's reward_std: mean over groups of the SAMPLE std
    # (divides by G - 1 = 1): group 1 mean 0.5, variance (0.25 + 0.25) / 1 = 0.5 -> sqrt(0.5); group 2: 0.
    # (sqrt(0.5) + 0) / 2 = 0.35355, not reward/std = sqrt(0.1875) = 0.43301 over the 4 rewards.
    st = in_group_reward_stats([[1.0, 0.0], [0.0, 0.0]])
    assert st["reward_std"] == pytest.approx(math.sqrt(0.5) / 2) and st["frac_reward_zero_std"] == 0.5
    # G = 4: (1,0,0,0) mean 0.25, squares 0.5625 + 3 * 0.0625 = 0.75, / 3 = 0.25 -> std 0.5;
    # (1,1,0,0) mean 0.5, squares 4 * 0.25 = 1, / 3 -> std sqrt(1/3) = 0.57735; (0,0,0,0) and (1,1,1,1): 0.
    # reward_std = (0.5 + 0.57735 + 0 + 0) / 4 = 0.26934; 2 of 4 groups all equal -> 0.5
    st = in_group_reward_stats([[1.0, 0, 0, 0], [1.0, 1, 0, 0], [0.0] * 4, [1.0] * 4])
    assert st["reward_std"] == pytest.approx((0.5 + math.sqrt(1 / 3)) / 4) and st["frac_reward_zero_std"] == 0.5
    # equal non-dyadic rewards are exactly zero spread (a naive mean of 0.1 * 3 leaves ~1e-17); one response: 0
    assert in_group_reward_stats([[0.1] * 3, [0.7]]) == {"reward_std": 0.0, "frac_reward_zero_std": 1.0}
    assert in_group_reward_stats([]) == {"reward_std": 0.0, "frac_reward_zero_std": 0.0}


def test_trl_aliases_repeat_graft_numbers_under_trl_names():
    m = {"response_length/mean": 4.0, "response_length/min": 2, "response_length/max": 7, "truncated_frac": 0.25,
         "clip_frac/own_low": 0.125, "clip_frac/own_high": 0.0625, "clip_frac/peer_low": 0.5, "loss": 1.0}
    # region = own low + own high = 0.125 + 0.0625 = 0.1875 (disjoint: opposite advantage signs); peer rows not in it
    assert trl_aliases(m) == {"completions/mean_length": 4.0, "completions/min_length": 2, "completions/max_length": 7,
                              "completions/clipped_ratio": 0.25, "clip_ratio/low_mean": 0.125,
                              "clip_ratio/high_mean": 0.0625, "clip_ratio/region_mean": 0.1875}
    assert trl_aliases({"loss": 1.0}) == {}


def test_console_line_shows_reward_loss_grad_entropy_and_admitted():
    m = {"A/reward/mean": 0.25, "A/loss": -0.0123456, "A/grad_norm": 0.4567, "A/entropy/mean": 1.23456,
         "A/all_fail_frac": 0.5, "A/peer_responses": 4, "B/reward/mean": 0.5, "B/loss": 0.02, "B/grad_norm": 1.5,
         "B/entropy/mean": None, "B/all_fail_frac": 0.0, "exchange/A->B/admitted": 2, "exchange/B->A/admitted": 0,
         "time/step_s": 12.34}
    assert console_line(3, 10, m, ["A", "B"]) == (
        "step 3/10 | A: reward 0.250 loss -0.01235 grad 0.457 entropy 1.235 all-fail 0.50 peer 4"
        " | B: reward 0.500 loss 0.02 grad 1.5 entropy - all-fail 0.00 peer 0 | A->B admitted 2 | B->A admitted 0 | 12.3s")


def test_mean_entropy_is_token_weighted_and_none_without_engine_entropies():
    a = Sample([1, 2, 3], [0.0] * 3, "x", True, entropies=[1.0, 1.0, 1.0])
    b = Sample([4], [0.0], "y", True, entropies=[3.0])
    assert mean_entropy([a, b]) == pytest.approx(6.0 / 4)          # (1 + 1 + 1 + 3) / 4 tokens
    assert mean_entropy([a, Sample([4], [0.0], "y", True)]) is None   # hf-cb / vllm report none


def test_completion_rows_take_the_first_response_of_the_first_prompts():
    gs = {"A": [_group([1.0, 0.0], [1.0, -1.0], [3, 7]), _group([0.0, 0.0], [0.0, 0.0], [2, 4])]}
    rows = completion_rows(5, gs, 1)
    assert rows == {"A": [{"step": 5, "model": "A", "prompt_id": "p", "prompt": "q", "completion": "r0",
                           "reward": 1.0, "advantage": 1.0}]}
    assert completion_rows(5, gs, 0) == {}


def test_gpu_memory_peaks_with_the_cuda_query_stubbed(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: 5 * 2**29)
    m = workers.process_memory()
    assert m["gpu_allocated_gb"] == 3.0 and m["gpu_reserved_gb"] == 2.5 and m["peak_rss_gb"] > 0

    class TwoRanks:   # a model's worker group: each rank reports its own peaks, the learner keeps the largest
        size = 2

        def call(self, method, args, what=""):
            assert method == "memory" and len(args) == 2
            return [{"peak_rss_gb": 1.0, "gpu_allocated_gb": 3.0, "gpu_reserved_gb": 2.5},
                    {"peak_rss_gb": 2.0, "gpu_allocated_gb": 1.0, "gpu_reserved_gb": 4.0}]

    learner = Learner.__new__(Learner)
    learner.workers = TwoRanks()
    assert learner.memory() == {"peak_rss_gb": 2.0, "gpu_allocated_gb": 3.0, "gpu_reserved_gb": 4.0}

    from graft.trainer import backends
    monkeypatch.setattr(backends, "RayWorkers", TwoRanks)
    assert backends.worker_memory({"A": learner}) == {"mem/peak_rss_gb/A": 2.0, "mem/gpu_allocated_gb/A": 3.0,
                                                         "mem/gpu_reserved_gb/A": 4.0}


# ----------------------------------------------------------------------------- the sampler's entropy

def test_sampler_entropy_is_the_forward_distributions(tiny_llama_policy):
    """Per-token entropy recorded while sampling = entropy of softmax(logits / T) of a plain forward."""
    pol = tiny_llama_policy
    prompt = pol.codec.encode_prompt("What is 2 + 3?")
    for T in (1.0, 0.7):
        (s,), = pol.generate([prompt], SamplingParams(n=1, max_new_tokens=6, temperature=T, seed=1, entropy=True))
        assert len(s.entropies) == len(s.token_ids) > 0
        with torch.no_grad():
            logits = pol.model(input_ids=torch.tensor([prompt + s.token_ids])).logits[0].float()
        logits = logits[len(prompt) - 1: len(prompt) - 1 + len(s.token_ids)] / T
        expected = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
        assert s.entropies == pytest.approx(expected.tolist(), abs=1e-4)


# ----------------------------------------------------------------------------- end to end

def test_metrics_jsonl_has_the_rl_metrics(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    crafted_rewards(monkeypatch)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=2")
    loop.train(cfg)
    rows = [json.loads(l) for l in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
    vocab = {"A": 49152, "B": 262144}
    for r in rows:
        for m in ("A", "B"):
            assert 0 < r[f"{m}/entropy/mean"] <= math.log(vocab[m]) + 1e-6
            assert r[f"{m}/reward/std"] >= 0 and r[f"{m}/advantage/std"] >= 0
            assert r[f"{m}/advantage/min"] <= r[f"{m}/advantage/mean"] <= r[f"{m}/advantage/max"]
            assert r[f"{m}/response_length/min"] <= r[f"{m}/response_length/mean"] <= r[f"{m}/response_length/max"]
            assert 0 <= r[f"{m}/reward_std"] and 0 <= r[f"{m}/frac_reward_zero_std"] <= 1
            assert r[f"{m}/completions/mean_length"] == r[f"{m}/response_length/mean"]
            assert r[f"{m}/clip_ratio/region_mean"] == pytest.approx(r[f"{m}/clip_frac/own_low"] + r[f"{m}/clip_frac/own_high"])
        assert "mem/gpu_allocated_gb" not in r     # CPU run: no CUDA used


def test_log_off_a_terminal_is_one_line_per_step(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    """stderr to a file with progress=true: no carriage returns, no bars, exactly one line per step."""
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=3")
    (tmp_path / "run.yaml").write_text("")
    from graft.config import save_config
    save_config(cfg, tmp_path / "run.yaml")
    log = tmp_path / "stderr.log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(log, "w") as f:
        subprocess.run([sys.executable, "-m", "graft.cli", "train", str(tmp_path / "run.yaml"), "progress=true"],
                       stderr=f, stdout=subprocess.DEVNULL, env=env, cwd=tmp_path, check=True, timeout=patient(600))
    text = log.read_text()
    assert "\r" not in text and "it/s" not in text and "%|" not in text
    steps = [l for l in text.splitlines() if l.startswith("step ")]
    assert [l.split(" | ")[0] for l in steps] == ["step 1/3", "step 2/3", "step 3/3"]
    assert all(l.endswith("s") and all(f"{m}: reward " in l for m in "AB") for l in steps)
    assert all(all(w in l for w in (" loss ", " grad ", " entropy ", " all-fail ")) for l in steps)


def test_progress_false_silences_the_loading_bars(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    from transformers.utils import logging as hf_logging

    import huggingface_hub.utils as hub_utils
    hf_logging.enable_progress_bar()
    try:
        run = loop.setup(tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir))   # progress=false
        try:
            assert not hf_logging.is_progress_bar_enabled() and hub_utils.are_progress_bars_disabled()
        finally:
            run.grader.close()
    finally:
        hf_logging.enable_progress_bar()
