"""Every figure the study's write-up added on 2026-12-07 (README.md "What the study found", docs/results.md,
configs/experiments/STUDY.md's dated notes, docs/default-pair.md) is re-derived here from the committed records by
``results/writeup/figures.py``: the per-prompt eval records of every run, the split files, the training prompts of the
plans' frozen config, the one-update test's rows and the default job's metrics. Each test fails if a record changes
(the figure moves), if ``results/writeup/figures.json`` is stale, or if the write-up no longer quotes the figure as
rounded here. Interval methods: the module's docstring."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "results" / "writeup" / "figures.py"
README = (REPO / "README.md").read_text()
RESULTS = (REPO / "docs" / "results.md").read_text()
STUDY = (REPO / "configs" / "experiments" / "STUDY.md").read_text()
DEFAULT_PAIR = (REPO / "docs" / "default-pair.md").read_text()


def _module():
    spec = importlib.util.spec_from_file_location("writeup_figures", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def fig() -> dict:
    return _module().derive()


def num(x: float) -> str:
    """``+1.3`` / ``−0.7`` as the write-up prints a point difference (a true minus sign)."""
    s = f"{x:+.1f}"
    return s.replace("-", "−") if s not in ("-0.0",) else "+0.0"


def ci(c: dict) -> str:
    return f"{num(c['mean'])} [{num(c['ci95'][0])}, {num(c['ci95'][1])}]"


def bounds(c: dict) -> str:
    return f"[{num(c['ci95'][0])}, {num(c['ci95'][1])}]"


def span(r: list[float]) -> str:
    return f"{r[0]:.1f}–{r[1]:.1f}"


def test_figures_json_is_what_the_records_give_today(fig):
    assert json.loads((SCRIPT.parent / "figures.json").read_text()) == json.loads(json.dumps(fig))


def test_the_rederived_pass1_is_each_runs_own():
    """The per-prompt records give each run's committed pass@1 macro exactly (so leaving prompts out is exact)."""
    mod = _module()
    for plan in (mod.STUDY, mod.CONFIRM):
        for results in plan.glob("runs/*/seed*/eval/*/results.json"):
            own = json.loads(results.read_text())["macro"]["pass@1"]["mean"]
            assert mod.macro(mod.per_prompt(results.parents[2], results.parent.name)) == pytest.approx(own, abs=1e-12)


def test_repeated_computations_in_the_committed_splits(fig):
    """The issue's count (integers in digits and the answer): 6 study prompts repeat training, 5 confirmation prompts
    repeat training or the study's; as computations (number words, implied operands): 13 and 8."""
    narrow, wide = fig["repeats"]["integers_and_answer"], fig["repeats"]["computation"]
    assert (len(narrow["study"]), len(narrow["confirm"]), len(wide["study"]), len(wide["confirm"])) == (6, 5, 13, 8)
    assert set(narrow["study"]) <= set(wide["study"]) and set(narrow["confirm"]) <= set(wide["confirm"])
    assert wide["confirm"]["test-latex-00003"] == ["latex-00228", "test-mul-00017"]          # 13 x 14, twice
    assert wide["study"]["test-latex-00003"] == ["mul-00125"] and wide["study"]["test-spelled-00015"] == ["spelled-00222"]
    assert wide["study"]["test-latex-00012"] == ["square-00037"]                               # 17 x 17 = 17 squared
    for doc in (RESULTS, STUDY):
        assert "13 of the" in doc and "8 of the" in doc and "test-latex-00003" in doc
    assert "13 held-out prompts that repeat a training computation" in README and "8 of 96 repeat" in README


def test_results_without_the_repeated_prompts_and_the_verdicts_do_not_move(fig):
    c = fig["without_repeats"]["comparisons"]
    cells = {
        "study/graft_n8-grpo_n8/smollm2": ("−0.6 [−4.5, +3.3]", "+0.2 [−4.1, +4.4]"),
        "study/graft_n8-grpo_n8/gemma3": ("−0.4 [−7.7, +7.0]", "−0.4 [−6.8, +6.0]"),
        "study/no_balance-grpo_n8/gemma3": ("+7.2 [+6.2, +8.1]", "+8.0 [+5.2, +10.8]"),
        "study/graft_n8-grpo_n16/smollm2": ("−3.6 [−10.6, +3.5]", "−3.8 [−12.6, +5.0]"),
        "study/graft_n8-grpo_n16/gemma3": ("−5.9 [−12.7, +0.9]", "−4.0 [−10.5, +2.5]"),
        "confirm/no_balance-grpo_n8/gemma3": ("−0.3 [−2.9, +2.2]", "−0.7 [−3.2, +1.9]"),
        "confirm/no_balance-grpo_n8/smollm2": ("+1.3 [−1.3, +3.9]", "+1.5 [−0.9, +4.0]"),
    }
    for key, (every, without) in cells.items():
        assert (ci(c[key]["all"]), ci(c[key]["without"])) == (every, without), key
        assert without in RESULTS, key
    assert c["study/graft_n8-grpo_n8/gemma3"]["without"]["n"] == 5 and c["confirm/no_balance-grpo_n8/gemma3"]["without"]["n"] == 8
    assert fig["without_repeats"]["confirm_verdict"] == "not confirmed"
    assert fig["without_repeats_integers_and_answer"]["confirm_verdict"] == "not confirmed"
    assert ci(fig["without_repeats_integers_and_answer"]["comparisons"]["confirm/no_balance-grpo_n8/gemma3"]["without"]) \
        == "+0.0 [−2.7, +2.7]"
    for doc in (README, STUDY):
        assert "+0.2 [−4.1, +4.4]" in doc and "−0.4 [−6.8, +6.0]" in doc and "−0.7 [−3.2, +1.9]" in doc
    assert "+8.0 [+5.2, +10.8]" in STUDY and "+0.0 [−2.7, +2.7]" in RESULTS


def test_the_study_readings_items_1_and_2_rest_on_these_intervals(fig):
    """GRAFT n=8 − GRPO n=16 over 3 pairs: both intervals include GRAFT being better (no detectable difference);
    GRPO n=16 − GRPO n=8 for Gemma-3 includes 0 (the withdrawn "adds as much" reading compared its mean)."""
    c = fig["without_repeats"]["comparisons"]
    for model in ("smollm2", "gemma3"):
        assert c[f"study/graft_n8-grpo_n16/{model}"]["all"]["ci95"][1] > 0 and c[f"study/graft_n8-grpo_n16/{model}"]["all"]["n"] == 3
    assert ci(c["study/grpo_n16-grpo_n8/gemma3"]["all"]) == "+6.5 [−3.5, +16.5]"
    assert "no detectable difference" in RESULTS.split("GRPO n=16 (twice the samples, twice the rollout")[1][:200]
    assert "is at least as good as GRAFT n=8" not in RESULTS.replace('"is at least as good as GRAFT n=8"', "")
    assert "+6.5 [−3.5, +16.5]" in RESULTS and "withdrawn" in RESULTS and "**withdrawn**" in STUDY


def test_power_after_the_fact_with_the_range_its_sd_implies(fig):
    p = fig["power"]
    expected = {
        "study/graft_n8-grpo_n8/smollm2": ("5.2", "3.1–14.9"),
        "study/graft_n8-grpo_n8/gemma3": ("9.8", "5.9–28.2"),
        "study/graft_n8-grpo_n16/smollm2": ("8.8", "4.6–55.3"),
        "study/graft_n8-grpo_n16/gemma3": ("8.5", "4.4–53.3"),
        "confirm/no_balance-grpo_n8/gemma3": ("3.6", "2.4–7.2"),
    }
    for key, (detectable, rng) in expected.items():
        assert (f"{p[key]['detectable']:.1f}", span(p[key]["detectable_range"])) == (detectable, rng), key
        assert rng in STUDY, key
    assert f"{p['confirm_preregistered']:.1f}" == "6.8"
    for doc in (README, RESULTS):
        assert "3.1–14.9 / 5.9–28.2" in doc and "2.4–7.2" in doc and "6.8" in doc and "computed after the runs" in doc
    assert "χ²₀.₉₇₅,ₙ₋₁" in RESULTS                                        # the formula, stated once


def test_one_update_test_clustered_by_seed_and_sign_flip(fig):
    o = fig["onestep"]
    rep_gs, rep_sg = o["graft/gemma3->smollm2/replaced"], o["graft/smollm2->gemma3/replaced"]
    uns_gs, uns_sg = o["graft/gemma3->smollm2/unseen"], o["graft/smollm2->gemma3/unseen"]
    assert len(o) == 8 and all(x["clustered"]["clusters"] == 4 and len(x["states"]) == 9 for x in o.values())
    assert (ci(rep_gs["t"]), ci(rep_sg["t"]), ci(uns_gs["t"]), ci(uns_sg["t"])) == (
        "+1.9 [−11.8, +15.5]", "+4.5 [−2.2, +11.2]", "+1.0 [−1.4, +3.3]", "+0.6 [−0.2, +1.3]")   # the committed t95
    assert (bounds(rep_gs["clustered"]), bounds(rep_sg["clustered"]), bounds(uns_gs["clustered"]),
            bounds(uns_sg["clustered"])) == ("[−17.5, +21.2]", "[−3.5, +12.5]", "[−1.8, +3.7]", "[−0.5, +1.7]")
    assert (rep_gs["zero_states"], rep_sg["zero_states"]) == (6, 6)
    flips = [x["sign_flip_p_states"] for x in (rep_gs, rep_sg, uns_gs, uns_sg)]      # exact: k / 512 and k / 16
    seeds = [x["sign_flip_p_seeds"] for x in (rep_gs, rep_sg, uns_gs, uns_sg)]
    assert (flips, seeds) == ([1, 0.25, 0.5, 0.125], [1, 0.25, 0.5, 0.5])
    # the clustered interval is the widest, so the sentence follows it: ~4 / ~2 points on unseen prompts
    for x in o.values():
        assert x["clustered"]["ci95"][1] - x["clustered"]["ci95"][0] > x["t"]["ci95"][1] - x["t"]["ci95"][0]
    assert round(uns_gs["clustered"]["ci95"][1]) == 4 and round(uns_sg["clustered"]["ci95"][1]) == 2
    assert [span(x["detectable_range"]) for x in (rep_gs, rep_sg, uns_gs, uns_sg)] == ["12.7–36.2", "6.3–17.8", "2.2–6.2", "0.7–2.1"]
    for doc in (RESULTS, STUDY):
        assert "[−17.5, +21.2]" in doc and "[−3.5, +12.5]" in doc and "[−1.8, +3.7]" in doc and "[−0.5, +1.7]" in doc
        assert "~4 / ~2" in doc and "6 of 9" in doc
    assert "[−1.8, +3.7] and [−0.5, +1.7] (exact sign-flip p 0.5 and 0.125)" in README
    assert "1 and 0.25 on replaced prompts,\n0.5 and 0.125 on unseen ones" in RESULTS
    assert "1 / 0.25 (replaced) and 0.5 / 0.125 (unseen)" in STUDY
    assert "12.7–36.2" in STUDY and "2.2–6.2 / 0.7–2.1" in STUDY


def test_one_update_test_unseen_prompts_that_repeat_training(fig):
    assert len(fig["onestep_unseen_training_repeats"]) == 11
    w = fig["onestep_without_unseen_repeats"]
    gs, sg = w["graft/gemma3->smollm2/unseen"], w["graft/smollm2->gemma3/unseen"]
    assert (ci(gs["clustered"]), ci(sg["clustered"])) == ("+1.3 [−0.4, +3.1]", "+0.3 [−1.3, +1.9]")
    assert "11 of the 94 unseen prompts" in RESULTS and "11 of the 94 unseen prompts" in STUDY
    assert "+1.3 [−0.4, +3.1]" in STUDY and "[−0.4, +3.1]" in RESULTS


def test_the_default_job_across_its_committed_runs(fig):
    d = fig["default_job"]
    assert d["of"] == 7 and sorted(d["correct_both_ways_every_step"]) == ["amd-prefix", "batch128", "exchange-plan", "update"]
    short = sorted(set(d["runs"]) - set(d["correct_both_ways_every_step"]))
    assert short == ["amd-final", "amd-head", "keep"]
    for run in short:   # both ways in steps 1-4, step 5 missing in at least one direction
        steps = d["runs"][run].values()
        assert all(all(x > 0 for x in s[:4]) for s in steps) and any(s[4] == 0 for s in steps)
    into_smollm2 = [sum(v["gemma3->smollm2"]) for v in d["runs"].values()]
    into_gemma3 = [sum(v["smollm2->gemma3"]) for v in d["runs"].values()]
    assert (min(into_smollm2), max(into_smollm2), min(into_gemma3), max(into_gemma3)) == (5, 7, 10, 13)
    assert "in all 5 steps in 4 of them" in README and "5–7 correct into SmolLM2 and 10–13 into Gemma" in README
    assert "**4 of the 7**" in DEFAULT_PAIR and "5–7 correct peer responses went into SmolLM2 and 10–13 into Gemma" in DEFAULT_PAIR


def test_the_unpaired_analyses_are_labelled_as_added_afterwards():
    head = README.split("## What the study found")[1].split("## Documentation")[0]
    assert "Added to the analysis after 7 of the 8 pairs were in, not pre-registered: unpaired" in head
    assert RESULTS.count("added to the analysis after 7 of the 8 pairs") == 2 and "05588dd" in STUDY
