"""report(): every plot exists as a non-empty PNG and the markdown references it."""
import json
import re

from graft.commands.report import report_main
from graft.evaluation.report import PLOTS, report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _check(md_path, expected):
    out = md_path.parent
    md = md_path.read_text()
    refs = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert sorted(refs) == sorted(expected)
    for name in expected:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000
    return md


def test_report_single_run_has_every_plot(graft_run, tmp_path):
    md = _check(report([graft_run], tmp_path / "rep"), PLOTS)
    assert "| graft_run | graft | A |" in md
    assert "Config differences" not in md  # only with several runs


def test_report_two_runs_side_by_side(graft_run, grpo_run, tmp_path):
    assert report_main([str(graft_run), str(grpo_run), "--out", str(tmp_path / "cmp")]) == 0
    md = _check(tmp_path / "cmp" / "report.md", PLOTS)
    assert "| graft_run | graft | B |" in md and "| grpo_run | grpo | B |" in md
    assert "`exchange.mode` | `graft` | `grpo` |" in md


def test_report_without_eval_skips_only_eval_plot(tmp_path):
    from tests.evaluation.conftest import make_run

    run = make_run(tmp_path / "noeval", "grpo", store=False)
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()[:3]]
    (run / "metrics.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if not k.startswith("eval/")}) + "\n"
                                               for r in rows))
    md = _check(report([run], tmp_path / "rep"), [p for p in PLOTS if p != "eval.png"])
    assert "No in-training evaluation" in md


def test_training_plot_draws_loss_grad_norm_entropy_and_length_on_whole_steps():
    from graft.evaluation.report import TRAINING_PANELS, training_figure

    rows = [{"step": s, "A/loss": 0.1 * s, "A/grad_norm": 1.0 + s, "A/entropy/mean": 2.0 - 0.1 * s,
             "A/response_length/mean": 10.0 + s, "A/response_length/min": 4, "A/response_length/max": 20}
            for s in (1, 2, 3)]
    fig = training_figure([("run", ["A"], rows)])
    fig.draw_without_rendering()
    axes = fig.axes
    assert [ax.get_ylabel() for ax in axes] == [label for _, label in TRAINING_PANELS]
    for ax, (key, _) in zip(axes, TRAINING_PANELS):
        (line,) = ax.get_lines()
        assert list(line.get_xdata()) == [1, 2, 3] and list(line.get_ydata()) == [r[f"A/{key}"] for r in rows]
        ticks = [t for t in ax.get_xticks() if 1 <= t <= 3]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks   # no 1.5, 2.5
    assert len(axes[3].collections) == 1    # the min-max band of response length


def test_a_plot_without_labelled_series_draws_no_legend_and_warns_nothing(tmp_path):
    """Candidates logged but no admitted fraction (no audit, no transferred/admitted counts): the admitted-fraction
    panel holds no series, and matplotlib's "No artists with labels found to put in legend" must not appear."""
    import warnings

    from tests.evaluation.conftest import make_run

    run = make_run(tmp_path / "noadmitted", "graft", store=False)
    (run / "audit.jsonl").unlink()
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()[:3]]
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({k: v for k, v in r.items() if not k.endswith(("/transferred", "/admitted"))}) + "\n" for r in rows))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _check(report([run], tmp_path / "rep"), PLOTS)
