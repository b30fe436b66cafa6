"""The end-of-run summary says how many responses were exchanged each way, and warns when none were (issue 14)."""
import io

from graft.trainer.loop import print_summary

BASE = {"run_dir": "runs/x", "steps": 8, "wall_clock_s": 10.0, "peak_rss_gb": 1.0, "final_checkpoint": None,
        "models": {"A": {"reward_first3_mean": 0.1, "reward_last3_mean": 0.2, "peer_responses_trained": 0,
                         "tokens_generated": 10}}}


def _text(summary):
    buf = io.StringIO()
    print_summary(summary, file=buf)
    return buf.getvalue()


def test_counts_per_direction_and_steps():
    out = _text(BASE | {"exchange": {"A->B": 12, "B->A": 5}, "exchange_steps": {"A->B": 4, "B->A": 2},
                        "exchange_expected": True})
    assert "exchange A->B: 12 peer responses admitted (in 4 of 8 steps)" in out
    assert "exchange B->A: 5 peer responses admitted (in 2 of 8 steps)" in out
    assert "WARNING" not in out
    assert "read the admitted peer responses: graft samples runs/x --from peer" in out


def test_warns_when_a_graft_run_exchanged_nothing():
    out = _text(BASE | {"exchange": {"A->B": 0, "B->A": 0}, "exchange_steps": {"A->B": 0, "B->A": 0},
                        "exchange_expected": True})
    assert "WARNING: no peer response was exchanged" in out and "graft probe runs/x/config.yaml --compat" in out
    assert "--from peer" not in out
    assert "WARNING" not in _text(BASE | {"exchange": {}, "exchange_expected": False})   # mode: grpo


def test_median_s_is_named_for_every_transferred_response_with_the_admitted_ones_beside_it():
    """Steps 1 and 3 transferred responses (median s of all of them 0.62 / 0.91), step 2 none (NaN: no median);
    the gate admitted some at step 1 (their median 0.88) and none at step 3 (NaN -> "-")."""
    nan = float("nan")
    out = _text(BASE | {"steps": 3, "exchange": {"A->B": 4}, "exchange_steps": {"A->B": 1}, "exchange_expected": True,
                        "exchange_s_p50": {"A->B": [0.62, nan, 0.91]},
                        "exchange_s_p50_admitted": {"A->B": [0.88, nan, nan]}})
    assert ("median s per step of all transferred responses (admitted and dropped) 0.62 0.91, "
            "of the admitted ones 0.88 -") in out
    # a summary without the admitted medians (a run from before they were logged) names only the first list
    old = _text(BASE | {"steps": 3, "exchange": {"A->B": 4}, "exchange_s_p50": {"A->B": [0.62, None, 0.91]}})
    assert "(admitted and dropped) 0.62 0.91" in old and "of the admitted ones" not in old
