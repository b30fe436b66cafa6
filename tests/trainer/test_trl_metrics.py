"""The metrics TRL users read: ``rewards/FUNC/mean|std`` of every reward function and ``num_tokens`` per model, and
the warning of a step 1 where no reward of a model crosses ``reward.success_threshold``."""
from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from graft.trainer import loop
from graft.trainer.metrics import TokenCounter, reward_function_stats, step_tokens
from graft.types import RolloutGroup
from tests.trainer.helpers import tiny_config

REPO = Path(__file__).resolve().parents[2]
M = "tests.reward.user_rewards:"


def _group(model: str, prompt: int, lengths: list[int], parts: dict | None = None) -> RolloutGroup:
    G = len(lengths)
    return RolloutGroup(prompt_id="p", problem="q", answer="a", source=model, holder=model, prompt_text="q",
                        prompt_token_ids=[1] * prompt, responses=[f"r{i}" for i in range(G)],
                        token_ids=[[5] * n for n in lengths], old_logprobs=[[0.0] * n for n in lengths],
                        gen_token_ids=[[5] * n for n in lengths], gen_logprobs=[[0.0] * n for n in lengths],
                        finished=[True] * G, rewards=[0.0] * G, status=["ok"] * G, reward_parts=parts or {})


# ----------------------------------------------------------------------------- pure parts


def test_reward_function_stats_hand_worked():
    # f: [1, None] and [0, 1] -> values 1, 0, 1 (None left out): mean 2/3, sample std sqrt((1/9 + 4/9 + 1/9) / 2)
    # = sqrt(1/3); g: [0.5, None] and [None, None] -> one value: mean 0.5, std None (TRL's nanstd of one value is NaN)
    gs = [_group("A", 1, [1, 1], {"f": [1.0, None], "g": [0.5, None]}), _group("A", 1, [1, 1], {"f": [0.0, 1.0], "g": [None, None]})]
    st = reward_function_stats(gs)
    assert st["rewards/f/mean"] == pytest.approx(2 / 3) and st["rewards/f/std"] == pytest.approx(math.sqrt(1 / 3))
    assert st["rewards/g/mean"] == 0.5 and st["rewards/g/std"] is None
    assert reward_function_stats([_group("A", 1, [1])]) == {}           # a domain grades: no reward functions


def test_num_tokens_counts_prompt_and_completion_of_every_response_and_survives_a_resume():
    # A: a 3-token prompt with responses of 2 and 4 tokens -> (3 + 2) + (3 + 4) = 12; B: 5-token prompt, one 1-token
    # response -> 6. Step 2 adds A 12 again -> 24.
    step = {"A": [_group("A", 3, [2, 4])], "B": [_group("B", 5, [1])]}
    assert step_tokens(step["A"]) == 12
    c = TokenCounter()
    assert c.add(step) == {"A/num_tokens": 12, "B/num_tokens": 6}
    assert c.add({"A": step["A"]}) == {"A/num_tokens": 24}
    resumed = TokenCounter()
    resumed.load_state_dict(c.state_dict(), [])
    assert resumed.add(step) == {"A/num_tokens": 36, "B/num_tokens": 12}
    # a checkpoint written before the counter existed: the last metrics record that has the totals
    old = TokenCounter()
    old.load_state_dict(None, [{"step": 1, "A/num_tokens": 12, "B/num_tokens": 6}, {"step": 2, "epoch": 0}])
    assert old.add({"B": step["B"]}) == {"B/num_tokens": 12}


# ----------------------------------------------------------------------------- end to end


def _rows(run_dir: Path) -> list[dict]:
    return [r for f in sorted((run_dir / "trajectories").glob("step_*.parquet")) for r in pq.read_table(f).to_pylist()]


@pytest.mark.slow
def test_two_reward_functions_log_their_own_means_and_num_tokens_grows_by_each_steps_tokens(
    tmp_path, tiny_llama_dir, tiny_gemma_dir, capsys
):
    """length_tenths (len / 10) and quarter (0.25), weights 1 and 2, on tiny random models: each function's logged
    mean and std are those of the values it gives the step's responses (read back from the trajectory store), the
    reward is their weighted sum, and num_tokens grows by the step's prompt + completion tokens. No reward is above a
    success threshold of 100, and none is 0 or 1: the warning names each model once, at step 1 only."""
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "batch_prompts=2", "rollout.n=2",
                      "update.num_minibatches=1", "rollout.max_new_tokens=5",
                      f"reward.function=['{M}length_tenths', '{M}quarter']", "reward.weights=[1.0, 2.0]",
                      "reward.success_threshold=100")
    loop.train(cfg)
    run_dir = Path(cfg.run_dir)
    metrics = {m["step"]: m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
    rows = _rows(run_dir)
    assert sorted(metrics) == [1, 2]
    for step, m in metrics.items():
        for model in ("A", "B"):
            texts = [r["response"] for r in rows if r["model"] == model and r["step"] == step]
            assert len(texts) == 4                                                  # 2 prompts x 2 samples
            lengths = [len(t) / 10 for t in texts]
            assert m[f"{model}/rewards/length_tenths/mean"] == pytest.approx(sum(lengths) / 4, abs=1e-12)
            assert m[f"{model}/rewards/length_tenths/std"] == pytest.approx(statistics.stdev(lengths), abs=1e-12)
            assert (m[f"{model}/rewards/quarter/mean"], m[f"{model}/rewards/quarter/std"]) == (0.25, 0.0)
            assert m[f"{model}/reward/mean"] == pytest.approx(sum(x + 2 * 0.25 for x in lengths) / 4, abs=1e-12)
            # this step's prompt + completion tokens: every response's tokens, and its prompt once per response
            grown = m[f"{model}/num_tokens"] - (metrics[step - 1][f"{model}/num_tokens"] if step > 1 else 0)
            assert grown == m[f"{model}/tokens/generated"] + 2 * m[f"{model}/tokens/prompt"] > 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "reward.success_threshold" in line]
    assert len(warnings) == 2, warnings                                             # step 1, once per model
    for model, line in zip(("A", "B"), warnings):
        largest = max(len(r["response"]) / 10 + 0.5 for r in rows if r["model"] == model and r["step"] == 1)
        assert line.startswith(f"warning: model {model}:") and "reward.success_threshold=100 " in line
        assert f"the largest is {largest:g};" in line
    names = documented_metrics((REPO / "docs" / "metrics.md").read_text())
    undocumented = {generic(k) for m in metrics.values() for k in m} - names
    assert not undocumented, f"logged but not in docs/metrics.md: {sorted(undocumented)}"


def documented_metrics(docs: str) -> set[str]:
    """The metric names of docs/metrics.md's tables: every backticked name of a row, ``a/b\\|c`` read as ``a/b`` and
    ``a/c``, a name starting with ``/`` continuing the row's previous one (`` `exchange/S->R/m`, `/kept_prompts` ``)."""
    names: set[str] = set()
    for line in docs.splitlines():
        prev = ""
        for tok in re.findall(r"`([^`]+)`", line) if line.startswith("|") else []:
            tok = prev + tok if tok.startswith("/") and prev else tok
            head, _, last = tok.replace("\\|", "|").rpartition("/")
            names |= {f"{head}/{alt}" if head else alt for alt in last.split("|")}
            prev = head or prev
    return names


def generic(key: str) -> str:
    """A logged key as the docs name it: no model prefix, directions ``S->R``, reward functions ``FUNC``."""
    key = re.sub(r"^[AB]/", "", key)
    key = re.sub(r"[AB]->[AB]", "S->R", key)
    return re.sub(r"^rewards/[^/]+/", "rewards/FUNC/", key)
