"""analyze() on crafted run folders: complementarity, exchange sizes, s distribution, clip rates."""
import json

import pytest

from graft.commands.analyze import analyze_main
from graft.evaluation.analyze import analyze, compute_analysis


def test_complementarity_from_store(graft_run):
    a = analyze(graft_run)
    ab, ba = a["complementarity"]["A->B"], a["complementarity"]["B->A"]
    assert ab["source"] == ba["source"] == "store"
    assert [p["value"] for p in ab["per_step"]] == pytest.approx([2 / 3, 1 / 2])
    assert [p["value"] for p in ba["per_step"]] == pytest.approx([1 / 2, 1 / 2])
    assert ab["overall"] == pytest.approx(0.6) and (ab["solved"], ab["receiver_all_fail"]) == (3, 5)
    assert ba["overall"] == pytest.approx(0.5)
    assert json.loads((graft_run / "analysis.json").read_text())["complementarity"]["A->B"]["overall"] == pytest.approx(0.6)


def test_complementarity_from_metrics_without_store(tmp_path):
    from tests.evaluation.conftest import make_run

    run = make_run(tmp_path / "nostore", "graft", store=False)
    c = compute_analysis(run)["complementarity"]["A->B"]
    assert c["source"] == "metrics"
    # logged 0.5 (B all-fail 0.5), 1.0 (B all-fail 0.25), null -> (0.25 + 0.25) / 0.75
    assert c["overall"] == pytest.approx(2 / 3)
    assert c["mean_of_steps"] == pytest.approx(0.75)


def test_exchange_sizes_admission_and_s(graft_run):
    a = compute_analysis(graft_run)
    ab = a["exchange"]["A->B"]
    # steps 1-2 from the audit log, step 3 (no audit record) from the metrics fallback
    assert [(p["candidates"], p["m"], p["kept"]) for p in ab["per_step"]] == [(2, 1, 1), (1, 1, 1), (2, 1, 1)]
    assert ab["totals"]["transferred"] == 4 + 2 and ab["totals"]["admitted"] == 2 + 1
    assert ab["totals"]["admitted_frac"] == pytest.approx(0.5)
    assert a["exchange"]["B->A"]["totals"]["admitted_frac"] == pytest.approx(1.0)
    s = a["s"]["all"]
    # sorted s: 0.5 0.7 0.81 0.85 0.9 0.95 1.2 2.5
    assert s["count"] == 8
    assert s["quantiles"]["p50"] == pytest.approx(0.875)
    assert s["quantiles"]["p0"] == pytest.approx(0.5) and s["quantiles"]["p100"] == pytest.approx(2.5)
    assert s["above_delta_frac"] == pytest.approx(6 / 8)
    counts, edges = s["histogram"]["counts"], s["histogram"]["edges"]
    assert sum(counts) == 8
    assert counts[edges.index(0.85)] == 1 and counts[edges.index(0.8)] == 1  # 0.85 -> [0.85, 0.9); 0.81 -> [0.8, 0.85)
    assert counts[-1] == 1  # 2.5 lands in the last (overflow) bin
    assert a["s"]["A->B"]["quantiles"]["p50"] == pytest.approx((0.7 + 0.9) / 2)


def test_clip_rates(graft_run):
    c = compute_analysis(graft_run)["clip"]
    assert c["A"]["own_low"] == pytest.approx(0.02)
    assert c["A"]["own_high"] == pytest.approx(0.03)
    assert c["A"]["peer_low"] == pytest.approx(0.002)   # steps 2 and 3 (step 1 had no peer data)
    assert c["A"]["peer_high"] == pytest.approx(0.003)
    assert c["A"]["steps_with_peer"] == 2
    assert c["A"]["peer_zero_clip_step_frac"] == pytest.approx(0.5)
    assert c["B"]["peer_low"] == pytest.approx(0.02)     # (0.01 + 0.03) / 2
    assert c["B"]["peer_zero_clip_step_frac"] == pytest.approx(0.0)


def test_rewards_eval_compute(graft_run):
    a = compute_analysis(graft_run)
    assert a["steps"] == 3  # torn line skipped
    assert a["rewards"]["A"]["reward"] == pytest.approx([0.1, 0.2, 0.3])
    assert a["rewards"]["A"]["final"] == pytest.approx(0.2)
    assert a["eval"]["eval/B/val/pass@1"]["best_step"] == 2
    assert a["eval"]["eval/A/val/pass@1"]["best_step"] == 2  # tie -> earlier step
    assert a["compute"]["wall_s"] == pytest.approx([3600, 10800, 21600])
    assert a["compute"]["tokens"] == pytest.approx([2000, 6000, 12000])


def test_grpo_run(grpo_run, capsys):
    assert analyze_main([str(grpo_run)]) == 0
    a = json.loads((grpo_run / "analysis.json").read_text())
    assert a["mode"] == "grpo"
    assert a["exchange"] == {} and a["s"] == {}
    assert a["complementarity"]["A->B"]["source"] == "metrics"
    assert a["clip"]["A"]["peer_low"] is None and a["clip"]["A"]["steps_with_peer"] == 0
    out = capsys.readouterr().out
    assert "complementarity" in out and "clip rates" in out


def test_against_another_run(tmp_path):
    from tests.evaluation.conftest import make_run

    r1 = make_run(tmp_path / "one", "grpo")
    r2 = make_run(tmp_path / "two", "grpo")
    c = compute_analysis(r1, against=r2)["complementarity"]
    # identical stores: one:A vs two:B equals A vs B of the same run
    assert c["one:A->two:B"]["overall"] == pytest.approx(0.6)
    assert c["two:B->one:A"]["overall"] == pytest.approx(0.5)


def test_missing_run(tmp_path):
    assert analyze_main([str(tmp_path / "nope")]) == 2


def test_reward_monitor_per_third_of_training():
    """Hand-worked: 3 steps, one per third. Step 1: 4 rewarded, operand share 0.5 -> 2 answers; step 2: 0 rewarded
    (shares None); step 3: 2 rewarded, operand 1.0. Per third: 0.5, None, 1.0; family rewards pass through;
    the text names each third and the family's chance level."""
    from graft.evaluation.analyze import families_chance, monitor_lines, reward_monitor, step_ranges

    flags = ("operator", "fraction", "multi_box", "example_copy", "echo")
    row = lambda step, n, op, fam: {"step": step, "A/rewarded/n": n, "A/rewarded/operand": op, "A/distinct_frac": 0.75,  # noqa: E731
                                    **{f"A/rewarded/{f}": (0.0 if n else None) for f in flags}, "A/reward/family/add": fam}
    mon = reward_monitor([row(1, 4, 0.5, 0.25), row(2, 0, None, 0.0), row(3, 2, 1.0, 0.5)], "A", {"add": 0.05})
    assert [e["steps"] for e in mon["ranges"]] == [[1, 1], [2, 2], [3, 3]] == [list(r) for r in step_ranges([1, 2, 3])]
    assert [e["operand"] for e in mon["ranges"]] == [0.5, None, 1.0]
    assert [e["rewarded"] for e in mon["ranges"]] == [4, 0, 2]
    assert [e["families"]["add"] for e in mon["ranges"]] == [0.25, 0.0, 0.5]
    text = "\n".join(monitor_lines({"A": mon}))
    assert "A steps 1-1: 4 rewarded" in text and "add: 25% -> 0% -> 50%  (5%)" in text
    # pooled over two steps of one third: (4 * 0.5 + 2 * 1.0) / 6 = 2/3
    two = reward_monitor([row(1, 4, 0.5, 0.25), row(2, 2, 1.0, 0.5)], "A", None)
    assert step_ranges([1, 2], 1) == [(1, 2)]
    assert families_chance({"data": {"train": "arithmetic", "arithmetic": {"families": ["max", "add"], "max_operand": 20}}})["max"] == 0.5
    assert [e["operand"] for e in two["ranges"]] == [0.5, 1.0]     # two steps in thirds: one step each
