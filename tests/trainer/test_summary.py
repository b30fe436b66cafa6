"""The end-of-run summary says how many responses were exchanged each way, and warns when none were (issue 14)."""
import io

import pytest

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


def test_a_tiny_run_logs_both_medians_and_its_summary_carries_them(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    """End to end on tiny models (crafted rewards: every step transfers in both directions; at δ 0.3 one direction's
    responses pass, the other's do not, with these seeds): per step and direction, ``exchange/S->R/s_p50`` is the median s of every response in the
    audit log (admitted or not) and ``s_p50_admitted`` of the admitted ones (NaN -> null when none), as summary.json
    lists them."""
    import json
    import math
    import re

    import torch

    from graft.trainer import loop
    from tests.trainer.helpers import crafted_rewards, tiny_config

    crafted_rewards(monkeypatch)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "exchange.delta=0.3", "checkpoint.save_final=false")
    summary = loop.train(cfg)
    audit = [json.loads(x) for x in (tmp_path / "run" / "audit.jsonl").read_text().splitlines()]
    median = lambda xs: float(torch.quantile(torch.tensor(xs, dtype=torch.float64), 0.5)) if xs else math.nan  # noqa: E731
    cases = set()
    for a in audit:
        d, i = f"{a['source']}->{a['receiver']}", a["step"] - 1
        every = [r["s"] for r in a["responses"]]
        kept = [r["s"] for r in a["responses"] if r["admitted"]]
        assert summary["exchange_s_p50"][d][i] == pytest.approx(median(every), rel=1e-9)
        got = summary["exchange_s_p50_admitted"][d][i]
        assert got is None if not kept else got == pytest.approx(median(kept), rel=1e-9)    # NaN is null in metrics.jsonl
        cases.add(bool(kept))
    assert len(audit) == 4 and cases == {True, False}     # steps with admitted responses, and steps with none
    out = _text(summary)
    for d in summary["exchange"]:   # a direction the gate admitted nothing in prints "-" for each step's median
        line = next(x for x in out.splitlines() if x.startswith(f"  exchange {d}:"))
        assert re.search(r"\(admitted and dropped\) [0-9. ]+, of the admitted ones [-0-9. ]+$", line), line
        assert line.endswith("of the admitted ones - -") == (summary["exchange"][d] == 0), line
