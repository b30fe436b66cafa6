"""graft analyze's treatment section (issue 20 §3): did the exchange happen, and what limited it."""
from __future__ import annotations

import pytest

from graft.evaluation.analyze import treatment, treatment_lines


def _x(reward: float, admitted: bool, s: float, lr: float, ls: float) -> dict:
    return {"reward_source": reward, "admitted": admitted, "s": s, "mean_logp_receiver": lr, "mean_logp_source": ls}


def test_treatment_hand_worked():
    # A->B over 3 steps. Step 1: candidates but m = 0 (balancing). Step 2: 2 transferred, the correct one
    # admitted (s 0.9), the wrong one not (s 0.5). Step 3: 2 transferred, both admitted (s 0.85, 0.95), one correct.
    # Correct: 2 transferred, 2 admitted; incorrect: 2 transferred, 1 admitted. Steps with transfers 2 and 3:
    # thirds of [2, 3] are (2, 2) and (3, 3); median s 0.7 -> 0.9, ratio 0.9 / 0.7; receiver log-p
    # mean(-1, -3) = -2 -> mean(-0.5, -0.5) = -0.5. Peer row share of B: steps 0.0, 0.1, 0.3 -> mean 0.1333,
    # in steps with any 0.2.
    audit = [
        {"step": 1, "source": "A", "receiver": "B", "candidates": [{"prompt_id": "p"}], "m": 0, "responses": []},
        {"step": 2, "source": "A", "receiver": "B", "candidates": [{"prompt_id": "q"}], "m": 1,
         "responses": [_x(1.0, True, 0.9, -1.0, -0.5), _x(0.0, False, 0.5, -3.0, -0.5)]},
        {"step": 3, "source": "A", "receiver": "B", "candidates": [{"prompt_id": "r"}], "m": 1,
         "responses": [_x(1.0, True, 0.85, -0.5, -0.2), _x(0.0, True, 0.95, -0.5, -0.2)]},
        {"step": 2, "source": "B", "receiver": "A", "candidates": [], "m": 1, "responses": []},
    ]
    rows = [{"step": 1, "B/peer_row_share": 0.0}, {"step": 2, "B/peer_row_share": 0.1}, {"step": 3, "B/peer_row_share": 0.3}]
    t = treatment(rows, audit, "A->B")
    assert (t["steps"], t["steps_with_candidates"], t["steps_balanced_to_zero"], t["steps_with_transfer"]) == (3, 3, 1, 2)
    assert (t["transferred_correct"], t["admitted_correct"], t["transferred_incorrect"], t["admitted_incorrect"]) == (2, 2, 2, 1)
    assert t["first_third"]["steps"] == [2, 2] and t["last_third"]["steps"] == [3, 3]
    assert t["first_third"]["s_median"] == pytest.approx(0.7) and t["last_third"]["s_median"] == pytest.approx(0.9)
    assert t["s_median_ratio"] == pytest.approx(0.9 / 0.7)
    assert t["first_third"]["mean_logp_receiver"] == pytest.approx(-2.0) and t["last_third"]["mean_logp_source"] == pytest.approx(-0.2)
    assert t["peer_row_share_mean"] == pytest.approx(0.4 / 3) and t["peer_row_share_mean_when_exchanging"] == pytest.approx(0.2)
    text = "\n".join(treatment_lines({"A->B": t}))
    assert "admitted 2 correct + 1 incorrect (gate passed 2/2 correct, 1/2 incorrect)" in text
    assert "1 steps with candidates balanced to m = 0" in text and "ratio 1.29" in text
    empty = treatment([], audit, "B->A")       # a direction that never transferred: counts 0, no drift
    assert empty["transferred_correct"] == 0 and empty["first_third"] is None and empty["s_median_ratio"] is None
