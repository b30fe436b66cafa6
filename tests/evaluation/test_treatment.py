"""graft analyze's treatment section: did the exchange happen, and what limited it."""
from __future__ import annotations

import pytest

from graft.evaluation.analyze import treatment, treatment_lines


def _x(reward: float, admitted: bool, s: float, lr: float, ls: float) -> dict:
    return {"reward_source": reward, "admitted": admitted, "s": s, "mean_logp_receiver": lr, "mean_logp_source": ls}


def test_treatment_hand_worked():
    # A->B over 6 steps; thirds of training (1, 2), (3, 4), (5, 6). Step 1: candidates but m = 0 (balancing).
    # Step 2: 2 transferred, the correct one admitted (s 0.9), the wrong one not (s 0.5). Steps 3, 4, 6: no
    # candidates. Step 5: 2 transferred, both admitted (s 0.85, 0.95), one correct. Correct: 2 transferred,
    # 2 admitted; incorrect: 2 transferred, 1 admitted. Median s first third 0.7 (step 2) -> last third 0.9
    # (step 5), ratio 0.9 / 0.7; receiver log-p mean(-1, -3) = -2 -> -0.5. Peer row share of B: 0, 0.1, 0, 0,
    # 0.3, 0 -> mean 0.4 / 6, in steps with any 0.2.
    none = {"source": "A", "receiver": "B", "candidates": [], "m": 0, "responses": []}
    audit = [
        {"step": 1, "source": "A", "receiver": "B", "candidates": [{"prompt_id": "p"}], "m": 0, "responses": []},
        {"step": 2, "source": "A", "receiver": "B", "candidates": [{"prompt_id": "q"}], "m": 1,
         "responses": [_x(1.0, True, 0.9, -1.0, -0.5), _x(0.0, False, 0.5, -3.0, -0.5)]},
        {"step": 3, **none}, {"step": 4, **none},
        {"step": 5, "source": "A", "receiver": "B", "candidates": [{"prompt_id": "r"}], "m": 1,
         "responses": [_x(1.0, True, 0.85, -0.5, -0.2), _x(0.0, True, 0.95, -0.5, -0.2)]},
        {"step": 6, **none},
        {"step": 2, "source": "B", "receiver": "A", "candidates": [], "m": 1, "responses": []},
    ]
    rows = [{"step": i + 1, "B/peer_row_share": x} for i, x in enumerate([0.0, 0.1, 0.0, 0.0, 0.3, 0.0])]
    t = treatment(rows, audit, "A->B", 0.5)
    assert (t["steps"], t["steps_with_candidates"], t["steps_balanced_to_zero"], t["steps_with_transfer"]) == (6, 3, 1, 2)
    assert (t["transferred_correct"], t["admitted_correct"], t["transferred_incorrect"], t["admitted_incorrect"]) == (2, 2, 2, 1)
    assert t["first_third"]["steps"] == [1, 2] and t["last_third"]["steps"] == [5, 6]
    assert t["first_third"]["s_median"] == pytest.approx(0.7) and t["last_third"]["s_median"] == pytest.approx(0.9)
    assert t["s_median_ratio"] == pytest.approx(0.9 / 0.7)
    assert t["first_third"]["mean_logp_receiver"] == pytest.approx(-2.0) and t["last_third"]["mean_logp_source"] == pytest.approx(-0.2)
    assert t["peer_row_share_mean"] == pytest.approx(0.4 / 6) and t["peer_row_share_mean_when_exchanging"] == pytest.approx(0.2)
    text = "\n".join(treatment_lines({"A->B": t}))
    assert "admitted 2 correct + 1 incorrect (gate passed 2/2 correct, 1/2 incorrect)" in text
    assert "1 steps with candidates balanced to m = 0" in text and "ratio 1.29" in text
    empty = treatment([], audit, "B->A", 0.5)       # a direction that never transferred: counts 0, no drift
    assert empty["transferred_correct"] == 0 and empty["first_third"] is None and empty["s_median_ratio"] is None


def test_a_last_third_without_transfers_has_no_median():
    # Transfers only in step 1 of 3 (thirds (1, 1), (2, 2), (3, 3)): the last third has no s, so no ratio —
    # the exchange stopped, which a ratio over the steps with transfers would hide.
    audit = [{"step": 1, "source": "A", "receiver": "B", "candidates": [{"prompt_id": "q"}], "m": 1,
              "responses": [_x(1.0, True, 0.9, -1.0, -0.5)]}]
    t = treatment([{"step": i} for i in (1, 2, 3)], audit, "A->B", 0.5)
    assert t["first_third"]["s_median"] == pytest.approx(0.9) and t["last_third"]["s_median"] is None
    assert t["last_third"]["steps"] == [3, 3] and t["s_median_ratio"] is None
