"""graft bench: pure helpers, the TRL settings it derives, one-line errors, and end-to-end runs on tiny models."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from graft.bench import cli, common, graft_vs_grpo, rollout_vs_generate, step_vs_trl, trl_settings
from graft.bench.args import bench_main
from graft.commands.cli import main
from graft.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]
DEFAULT = str(REPO / "configs" / "default.yaml")


# ----------------------------------------------------------------------------- pure helpers

def test_parse_only_keeps_canonical_order_and_rejects_unknown_parts():
    assert cli.parse_only("c, a") == ("a", "c")
    for bad in ("a,x", "", " , "):
        with pytest.raises(ConfigError, match="--only"):
            cli.parse_only(bad)


def test_cpu_features_name_the_matmul_instruction_sets():
    """Two hosts both called "AMD EPYC" ran this bench 2.5x apart (one without AVX-512 and bf16): the table says which."""
    zen4 = "processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\nflags\t\t: fpu avx2 avx512f avx512_bf16 sse\n\nprocessor\t: 1\n"
    zen1 = "processor\t: 0\ncpu family\t: 23\nmodel\t\t: 1\nflags\t\t: fpu avx avx2 sse4_2\n"
    assert common.cpu_features(zen4) == "family 25 model 17: avx2 avx512f avx512_bf16"
    assert common.cpu_features(zen1) == "family 23 model 1: avx2"
    assert common.cpu_features("processor\t: 0\nflags\t\t: fpu sse\n") == "family ? model ?: no AVX2"


def test_alternate_runs_sides_in_turn_and_records_memory():
    calls = []
    sides = [(name, lambda i, name=name: calls.append((name, i)) or {"v": i}) for name in ("A", "B")]
    rows = common.alternate(3, sides, "t", lambda r: str(r["v"]))
    assert calls == [("A", 0), ("B", 0), ("A", 1), ("B", 1), ("A", 2), ("B", 2)]
    assert [r["v"] for r in rows["B"]] == [0, 1, 2]
    assert all(r["peak_rss_gb"] > 0 and r["peak_rss_scope"] in ("side", "process") for r in rows["A"])


def test_series_median_skips_missing_values_and_keeps_all_raw():
    assert common.series([3.0, None, 1.0, 2.0]) == {"median": 2.0, "values": [3.0, None, 1.0, 2.0]}
    assert common.series([])["median"] is None
    assert common.clean({"x": float("nan"), "y": (1, float("inf"))}) == {"x": None, "y": [1, None]}


def test_generated_lengths_count_up_to_the_stop_token_or_the_first_pad():
    stop, pad = {7}, 0
    gen = torch.tensor([[5, 6, 7, 0, 0],    # EOS at 2: 3 tokens
                        [5, 6, 5, 6, 5],    # truncated: full width
                        [5, 6, 0, 0, 0]])   # ended by a stop string, then padded: 2 tokens
    assert rollout_vs_generate.generated_lengths(gen, stop, pad) == [3, 5, 2]
    assert rollout_vs_generate.generated_lengths(torch.tensor([[7, 7, 7]]), {7}, 7) == [1]   # pad == EOS


def test_exchange_counts_sum_every_direction():
    m = {"exchange/A->B/transferred": 8, "exchange/B->A/transferred": 4, "exchange/A->B/admitted": 5,
         "exchange/B->A/admitted": None, "A/peer_responses": 3}
    assert graft_vs_grpo.exchange_counts(m) == {"transferred": 12, "admitted": 5}


def test_trl_settings_follow_the_graft_config():
    cfg = load_config(DEFAULT, ["batch_prompts=4", "rollout.n=8", "rollout.max_new_tokens=48",
                                "update.clip_low=0.15", "models.0.lr=3.0e-6"])
    kw = trl_settings.trl_config_kwargs(cfg, cfg.models[0], Path("/tmp/x"), True, {"activation_checkpointing"})
    assert kw["per_device_train_batch_size"] * kw["steps_per_generation"] == 4 * 8      # one generation batch ...
    assert kw["steps_per_generation"] == cfg.update.num_minibatches == kw["max_steps"]  # ... = M optimizer steps
    assert kw["gradient_accumulation_steps"] == 1 and kw["num_iterations"] == 1 and kw["num_generations"] == 8
    assert kw["loss_type"] == "bnpo" and kw["beta"] == 0.0
    assert (kw["epsilon"], kw["epsilon_high"]) == (0.15, cfg.update.clip_high)
    assert (kw["temperature"], kw["top_p"], kw["top_k"]) == (cfg.rollout.temperature, cfg.rollout.top_p, 0)
    assert kw["max_completion_length"] == 48 and kw["learning_rate"] == 3e-6
    assert kw["lr_scheduler_type"] == "constant" and kw["max_grad_norm"] == cfg.models[0].max_grad_norm
    assert kw["activation_checkpointing"] is False and "gradient_checkpointing" not in kw
    assert kw["bf16"] is False and kw["use_cpu"] is True and kw["use_vllm"] is False
    assert trl_settings.trl_batch_problem(cfg) is None
    assert "do not split" in trl_settings.trl_batch_problem(load_config(DEFAULT, ["batch_prompts=6"]))
    assert trl_settings.micro_batch_difference(cfg) == []          # 8 completions per minibatch, micro-batch 8
    assert trl_settings.micro_batch_difference(load_config(DEFAULT, ["rollout.n=16"]))


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("argv, words", [
    (["--only", "a,z"], "--only"),
    (["--reps", "0"], "--reps"),
    (["--only", "b", "--models", "/nonexistent/model-folder"], "does not exist"),
    (["--only", "c", "exchange.kind=none", "models=[{name: A, path: embedded:smollm2-135m-instruct}]"], "two models"),
    (["--config", "/nonexistent.yaml"], "not found"),
])
def test_bad_input_is_one_error_line(argv, words, capsys):
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and words in err[0]


# ----------------------------------------------------------------------------- end to end (tiny models)

def _tiny_args(tmp_path, llama, gemma, *extra):
    models = (f"models=[{{name: A, path: '{llama}', template: chat, fewshot: 2, lr: 1.0e-3}}, "
              f"{{name: B, path: '{gemma}', template: plain, lr: 1.0e-3}}]")
    return ["--config", DEFAULT, "--model", llama, "--reps", "1", "--prompts", "2", "--n", "4",
            "--max-new-tokens", "4", "--threads", "1", "--out", str(tmp_path / "out"), *extra,
            models, "update.num_minibatches=2", "data.arithmetic.num_prompts=16", "data.shuffle=false", "reward.workers=0"]


@pytest.mark.slow
def test_bench_runs_graft_sides_end_to_end(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch, capsys):
    from tests.trainer.helpers import crafted_rewards

    crafted_rewards(monkeypatch)   # prompt 0: A solves 1 of 4, prompt 1: B solves 1 of 4 -> an exchange each step
    monkeypatch.setattr(step_vs_trl, "trl_unavailable_reason", lambda: "TRL is not installed (pip install 'graft[bench]')")
    assert bench_main(_tiny_args(tmp_path, tiny_llama_dir, tiny_gemma_dir)) == 0
    out = tmp_path / "out"
    res = json.loads((out / "bench.json").read_text())
    md = (out / "bench.md").read_text()
    assert capsys.readouterr().out.strip() == md.strip()

    assert res["settings"]["parts"] == ["a", "b", "c"] and res["settings"]["reps"] == 1
    assert {"torch", "transformers", "trl", "cpu_model", "cpu_features", "torch_threads"} <= set(res["environment"])
    assert res["environment"]["cpu_features"] in md and f"temperature {res['settings']['temperature']}" in md
    assert res["environment"]["torch_threads"] == 1

    a = res["a"]
    assert a["trl"] == {"skipped": "TRL is not installed (pip install 'graft[bench]')"}
    assert len(a["prompts"]) == 2 and a["graft"]["step_s"]["median"] > 0
    raw = a["graft"]["raw"][0]
    assert raw["tokens_generated"] == raw["metrics"]["A/tokens/generated"] > 0
    assert raw["step_s"] >= raw["rollout_s"] + raw["update_s"] - 1e-6
    assert raw["tokens_update"] > 0     # the crafted rewards give A's prompt 0 a group with signal
    assert raw["rollout_tokens_per_s"] == pytest.approx(raw["tokens_generated"] / raw["rollout_s"])
    assert raw["metrics"]["A/tokens/prompt"] > 0 and raw["step_gflop"] == raw["rollout_gflop"] + raw["update_gflop"] > 0
    assert raw["step_gflops"] == pytest.approx(raw["step_gflop"] / raw["step_s"])
    assert res["environment"]["matmul_peak_gflops"] > 0
    assert "step GFLOP/s" in md and "of the measured matmul peak" in md and "fp32 matmul peak on this host" in md

    assert set(res["b"]) == {tiny_llama_dir, tiny_gemma_dir}
    for m in res["b"].values():
        for side in ("graft", "graft_bf16", "generate"):
            r = m[side]["raw"][0]
            assert 0 < r["tokens"] <= 2 * 4 * 4 and r["tokens_per_s"] == pytest.approx(r["tokens"] / r["seconds"])
        r = m["graft_bf16"]["raw"][0]
        assert r["tokens_per_s_with_recompute"] == pytest.approx(r["tokens"] / (r["seconds"] + r["recompute_s"]))
        assert 0 < r["logprob_gap_mean"] <= r["logprob_gap_max"] < 0.5
    assert res["b"][tiny_gemma_dir]["stop_strings"] == ["\nProblem:"]

    c = res["c"]
    assert c["exchange_ensured_by"].startswith("exchange.balance=none")
    assert c["repetitions_with_exchange"] == 1
    g, r = c["graft"]["raw"][0], c["grpo"]["raw"][0]
    assert g["tries"] == 1 and g["attempts"][0]["transferred"] == g["transferred"]
    assert g["transferred"] > 0 and r["transferred"] == 0 and r["exchange_s"] < g["exchange_s"]
    assert 0 < g["exchange_share"] < 1 and g["exchange_share"] == pytest.approx(g["exchange_s"] / g["step_s"])
    assert c["exchange_share_when_exchanged"]["median"] == g["exchange_share"]

    for title in ("## (a)", "TRL is not installed", "## (b)", "rollout.engine=hf-bf16", "## (c)", "## (d)",
                  "Differences that remain"):
        assert title in md


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="TRL not installed (pip install 'graft[bench]')")
def test_bench_trl_side_on_the_tiny_llama(tmp_path, tiny_llama_dir, tiny_gemma_dir, capsys):
    assert bench_main(_tiny_args(tmp_path, tiny_llama_dir, tiny_gemma_dir, "--only", "a")) == 0
    res = json.loads((tmp_path / "out" / "bench.json").read_text())
    a, trl = res["a"], res["a"]["trl"]
    assert "skipped" not in trl and trl["version"] == res["environment"]["trl"]
    assert a["prompt_ids_match"] is True
    row = trl["raw"][0]
    assert row["optimizer_steps"] == 2                      # update.num_minibatches
    assert row["tokens_generated"] > 0 and row["train_call_s"] >= row["step_s"] > 0
    assert row["rollout_s"] > 0 and row["score_s"] >= 0
    assert row["update_s"] == pytest.approx(row["step_s"] - row["rollout_s"] - row["score_s"])
    assert row["rollout_tokens_per_s"] == pytest.approx(row["tokens_generated"] / row["rollout_s"])
    assert trl["config"]["loss_type"] == "bnpo" and trl["config"]["per_device_train_batch_size"] == 4
    assert set(res) >= {"a"} and "b" not in res and "c" not in res
    assert "| step |" in (tmp_path / "out" / "bench.md").read_text()
    assert "train_runtime" not in capsys.readouterr().out      # TRL's end-of-train print is removed


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="TRL not installed (pip install 'graft[bench]')")
def test_a_trl_without_a_matching_setting_is_refused_before_loading(monkeypatch):
    from types import SimpleNamespace

    from graft.bench import trl_trainer  # imports TRL

    monkeypatch.setattr(trl_trainer, "trl_config_kwargs", lambda *a: {"loss_type": "bnpo", "no_such_grpo_field": 1})
    learner = SimpleNamespace(policy=SimpleNamespace(device=torch.device("cpu")))
    with pytest.raises(trl_settings.TrlUnsupported, match="no_such_grpo_field"):
        trl_trainer.TrlBench(load_config(DEFAULT), load_config(DEFAULT).models[0], [], None, learner, Path("/tmp/x"))
