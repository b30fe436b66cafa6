"""``reward.success_threshold``: one definition of success (graft/success.py), read by everything that counts one.

Hand-worked cases: a group with rewards [0.3, 0.3] is all-fail at 0.5 and solved twice at 0.25; the field is checked
at load; the readers of a finished run take it from its config.yaml; no 0.5 that means success is left in graft/.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from graft.algos.advantages import success_counts
from graft.algos.selection import candidate_mask
from graft.config import ConfigError, RewardConfig, UpdateConfig, load_config, run_success_threshold, success_threshold_of
from graft.reward.code import rewarded_from
from graft.success import succeeded
from graft.trainer.metrics import group_stats, success_warnings
from graft.trainer.rules import make_rule
from graft.types import RolloutGroup

GRAFT = Path(__file__).resolve().parents[1] / "graft"


def group(model: str, rewards: list[float], pid: str = "p0", source: str | None = None) -> RolloutGroup:
    n = len(rewards)
    return RolloutGroup(
        prompt_id=pid, problem="q", answer="a", source=source or model, holder=model, prompt_text="", prompt_token_ids=[1, 2],
        responses=[f"r{i}" for i in range(n)], token_ids=[[7]] * n, old_logprobs=[[-1.0]] * n, gen_token_ids=[[7]] * n,
        gen_logprobs=[[-1.0]] * n, finished=[True] * n, rewards=list(rewards), status=["ok"] * n, advantages=[0.0] * n,
        weights=[1.0] * n, compat=[1.0] * n,
    )


# ----------------------------------------------------------------------------- the definition


def test_a_success_is_a_reward_strictly_above_the_threshold():
    assert succeeded(0.3, 0.25) and not succeeded(0.3, 0.5)
    assert not succeeded(0.5, 0.5) and succeeded(0.5000001, 0.5)      # equal is not above
    assert succeeded(torch.tensor([0.3, 0.6]), 0.5).tolist() == [False, True]


def test_rewards_03_03_are_all_fail_at_05_and_two_successes_at_025():
    # [[0.3, 0.3], [1, 0]]: at 0.5 k = [0, 1] (0.3 is not above 0.5: the first group is all-fail);
    # at 0.25 k = [2, 1] (0.3 > 0.25 twice: no all-fail group).
    rewards = torch.tensor([[0.3, 0.3], [1.0, 0.0]])
    assert success_counts(rewards, 0.5).tolist() == [0, 1]
    assert success_counts(rewards, 0.25).tolist() == [2, 1]
    g = group("A", [0.3, 0.3])
    assert g.successes(0.5) == 0 and g.successes(0.25) == 2
    # all_fail_frac of the two groups: 1/2 at 0.5, 0 at 0.25; all_correct_frac: 0 at 0.5, 1/2 at 0.25 ([0.3, 0.3])
    gs = [g, group("A", [1.0, 0.0], "p1")]
    assert (group_stats(gs, 0.5)["all_fail_frac"], group_stats(gs, 0.5)["all_correct_frac"]) == (0.5, 0.0)
    assert (group_stats(gs, 0.25)["all_fail_frac"], group_stats(gs, 0.25)["all_correct_frac"]) == (0.0, 0.5)


def test_the_candidate_set_follows_the_threshold():
    # receiver R: p0 [0.3, 0.3], p1 [0, 0]; source S: p0 [0.6, 0], p1 [0.4, 0] (n = 2).
    # At 0.5: k_R = [0, 0], k_S = [1, 0] -> C_{S->R} = {p0} (p1: S fails too).
    # At 0.25: k_R = [2, 0], k_S = [1, 1] -> C_{S->R} = {p1} (p0 is no longer all-fail for R).
    recv = torch.tensor([[0.3, 0.3], [0.0, 0.0]])
    src = torch.tensor([[0.6, 0.0], [0.4, 0.0]])
    at = lambda t: candidate_mask(success_counts(recv, t), success_counts(src, t), n=2).tolist()  # noqa: E731
    assert at(0.5) == [True, False]
    assert at(0.25) == [False, True]


def test_sgt_trains_on_the_peer_responses_above_the_threshold():
    # a peer group [0.3, 0.6, 0.0]: at 0.5 one success (index 1) is an NLL row; at 0.25 two (0 and 1)
    peer = group("R", [0.3, 0.6, 0.0], source="S")
    for threshold, kept in ((0.5, [1]), (0.25, [0, 1])):
        rule = make_rule(UpdateConfig(rule="sgt"), threshold)
        (prepared,) = rule.prepare([peer])
        assert prepared.index == kept and all(rule.supervised(prepared, i) for i in range(prepared.size))


def test_held_out_code_tests_run_from_the_first_rewarded_count():
    # 4 counted tests with partial credit: 2/4 = 0.5 is not above 0.5, 3/4 is -> 3; at 0.25: 2/4 -> 2 (1/4 is not
    # above 0.25); without partial credit only 4/4 = 1 scores -> 4; at 0.99 still 4 (1.0 > 0.99)
    assert rewarded_from(4, True, 0.5) == 3 and rewarded_from(4, True, 0.25) == 2
    assert rewarded_from(4, False, 0.5) == 4 and rewarded_from(4, True, 0.99) == 4
    assert [rewarded_from(t, True, 0.5) for t in (1, 2, 3, 5)] == [t // 2 + 1 for t in (1, 2, 3, 5)]   # the old rule


# ----------------------------------------------------------------------------- the warning at step 1


def test_the_warning_names_the_model_the_threshold_and_the_largest_reward():
    # A: [0.3, 0.4] -- not 0/1 and nothing above 0.5 -> one line naming A, 0.5 and the largest reward 0.4.
    # B: [0, 0] -- 0/1 rewards, nothing solved yet: no line. C: [0.3, 0.6] -- 0.6 succeeds: no line.
    lines = success_warnings({"A": [group("A", [0.3, 0.4])], "B": [group("B", [0.0, 0.0])],
                              "C": [group("C", [0.3, 0.6])]}, 0.5)
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith("warning: model A:") and "reward.success_threshold=0.5" in lines[0]
    assert "the largest is 0.4" in lines[0]
    assert success_warnings({"A": [group("A", [0.3, 0.4])]}, 0.25) == []       # 0.3 > 0.25: successes


# ----------------------------------------------------------------------------- the field and the readers


def test_the_default_is_05_and_the_field_is_checked_at_load():
    assert RewardConfig().success_threshold == 0.5
    assert load_config("default", ["reward.success_threshold=0.25"]).reward.success_threshold == 0.25
    for bad, why in (("1.0", "must be in [0, 1)"), ("-0.1", "must be in [0, 1)"), (".inf", "must be finite")):
        with pytest.raises(ConfigError, match=re.escape(f"reward.success_threshold: {why}")):
            load_config("default", [f"reward.success_threshold={bad}"])
    # with reward functions the rewards may be on any scale: any finite value
    assert RewardConfig(function=["m:f"], success_threshold=2.0).success_threshold == 2.0
    with pytest.raises(ConfigError, match="must be finite"):
        RewardConfig(function=["m:f"], success_threshold=float("nan"))


def test_a_finished_run_is_read_with_its_own_threshold(tmp_path):
    assert success_threshold_of({"reward": {"success_threshold": 0.25}}) == 0.25
    assert success_threshold_of({"reward": {"domain": "math"}}) == 0.5          # a run of an earlier graft
    assert success_threshold_of(None) == 0.5
    assert run_success_threshold(tmp_path) == 0.5                                 # no config.yaml
    (tmp_path / "config.yaml").write_text("reward:\n  success_threshold: 0.75\n")
    assert run_success_threshold(tmp_path) == 0.75


def test_no_05_that_means_success_is_left_in_graft():
    """Success is decided in one place (graft/success.py) at the threshold of the config; a comparison with 0.5 (or
    an old constant) elsewhere would be a second, hidden definition."""
    pattern = re.compile(r"(?<!-)[<>]=?\s*0\.5\b(?!\d)|\b0\.5\s*[<>]|SUCCESS_THRESHOLD|CORRECT_THRESHOLD|==\s*1\.0\b")
    hits = [f"{p.relative_to(GRAFT.parent)}:{i}: {line.strip()}"
            for p in sorted(GRAFT.rglob("*.py")) for i, line in enumerate(p.read_text().splitlines(), 1)
            if pattern.search(line) and "factor == 1.0" not in line]
    assert hits == [], "\n".join(hits)
    assert "success_threshold: float = 0.5" in (GRAFT / "config" / "reward.py").read_text()
