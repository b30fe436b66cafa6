"""A plan's ``REPORT.md`` and plots, written beside ``summary.json`` (:func:`write_summary`)."""

from __future__ import annotations

import json
from pathlib import Path

from graft.commands.experiment.plan import Plan, plan_path_hint, plan_seeds
from graft.commands.experiment.summary import CHANCE_FAMILY, _mean, _std, summarize
from graft.evaluation import report as rep
from graft.evaluation.analyze import compute_analysis
from graft.reward.shortcuts import FLAGS


def _num2(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def _fmt(mean: float | None, std: float | None = None) -> str:
    if mean is None:
        return "–"
    return f"{100 * mean:.1f}" + (f" ± {100 * std:.1f}" if std is not None else "")


def _pts(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:+.1f} points"


def _seed_cells(xs: list) -> str:
    ys = [x for x in xs if x is not None]
    return _fmt(_mean(ys), _std(ys)) + f" [{len(ys)}]"


def _and(names: list[str]) -> str:
    return " and ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else "".join(names)


def report_markdown(plan: Plan, summary: dict, plots: dict[str, str]) -> str:
    """REPORT.md: pass@1 per arm, the strict re-grade, the declared comparisons, per data set, the exchange,
    the plots and the commands."""
    md = _pass1_section(plan, summary) + strict_section(plan, summary) + _stored_vs_online_lines(plan, summary)
    md += _paired_lines(plan, summary, "", "") + decision_lines(plan, summary)
    md += _dataset_table(summary) + _exchange_section(summary)
    md += _last_quarter_table(summary) + _one_step_section(summary) + _plot_sections(plots) + _commands(plan)
    return "\n".join(md) + "\n"


def _pass1_section(plan: Plan, summary: dict) -> list[str]:
    """The heading and the table of pass@1 per arm and model, with the stored-peer and base rows."""
    A = summary["models"]
    title = f"{plan.name}: {plan.title}" if plan.title else plan.name
    md = [f"# {title} on {_and(A)}", ""]
    md += [
        "pass@1 (%) on held-out prompts (macro over "
        + ", ".join(summary["eval"]["data"])
        + f"; n = {summary['eval']['n']} samples per prompt, T = {summary['eval']['temperature']}, "
        f"top-p {summary['eval']['top_p']}), mean ± std over seeds (seeds run per arm in brackets).",
        "",
    ]
    md += ["| arm | " + " | ".join(A) + " | pair mean |", "|---|" + "---:|" * (len(A) + 1)]
    for arm, vals in summary["arms"].items():
        means = [_mean([x for x in vals[a] if x is not None]) for a in A]
        pair = _mean(means) if None not in means else None
        md.append(f"| {arm} | " + " | ".join(_seed_cells(vals[a]) for a in A) + f" | {_fmt(pair)} |")
    for a in A:
        xs = [x for x in summary["stored"].get(a, []) if x is not None]
        if xs:
            md.append(f"| stored peer ({a} receives) | " + " | ".join(_fmt(_mean(xs)) if b == a else "" for b in A) + " | |")
    if summary.get("base"):
        md.append("| base (starting weights) | " + " | ".join(_fmt(summary["base"][a]) for a in A) + " | |")
    return md


def _stored_vs_online_lines(plan: Plan, summary: dict) -> list[str]:
    md = []
    versus = [c for c in plan.comparisons if c.baseline == plan.stored_from]
    for a, rows in summary.get("stored_vs_online", {}).items():
        for c in versus:
            for r in (r for r in rows if c.arm in r and c.baseline in r):
                md += [
                    "",
                    f"Stored vs online, {a} (seed {r['seed']}): stored peer {_fmt(r['stored'])}, "
                    f"{plan.label(c.baseline)} {_fmt(r[c.baseline])}, {plan.label(c.arm)} {_fmt(r[c.arm])}: "
                    f"stored gain {_pts(r['stored_gain'])}, online gain {_pts(r['online_gain'])}, "
                    f"ratio {_ratio(r)} (paper: 84 %).",
                ]
    return md


def _ratio(row: dict) -> str:
    if row["ratio"] is not None:
        return f"{100 * row['ratio']:.0f} %"
    if row["online_gain"] is None or row["stored_gain"] is None:
        return "not defined (a run is missing)"
    return "not defined (online gain ≤ 0)"


def _paired_lines(plan: Plan, summary: dict, suffix: str, grading: str) -> list[str]:
    """Each declared comparison's per-seed differences and their mean with a paired Student-t 95 % interval
    over seeds (summary.json ``paired_diff_NAME`` / ``paired_ci_NAME`` + ``suffix``)."""
    rows = _paired_rows(plan, summary, suffix)
    if not rows:
        return []
    return [
        "",
        f"Paired difference, same seed{grading} (points): per seed, and their mean with a Student-t 95 % "
        "interval over the pairs run so far (none from one pair). *Detectable*: the smallest true difference "
        "a paired t-test (α = 0.05, two-sided) finds with 80 % power at these pairs' number and spread.",
        "",
        "| comparison | model | per seed | mean [95 % CI] (pairs) | detectable |",
        "|---|---|---|---:|---:|",
        *rows,
        *_unpaired_lines(plan, summary, suffix),
    ]


def _unpaired_lines(plan: Plan, summary: dict, suffix: str) -> list[str]:
    """Each comparison with every seed of both arms, pairing ignored (summary.json ``unpaired_NAME`` + ``suffix``):
    a gain read from pairs alone can be a few low baseline seeds."""
    rows = [
        f"| {plan.label(c.arm)} − {plan.label(c.baseline)} | {a} | {_unpaired_cell(s)} | {_p(s['p_rank_sum'])} |"
        for c in plan.comparisons
        for a, s in (summary.get(f"unpaired_{c.name}{suffix}") or {}).items()
        if s["diff"] is not None
    ]
    if not rows:
        return []
    return [
        "",
        "Unpaired, every seed of both arms (points): difference of the arms' means with Welch's 95 % interval "
        "(Welch–Satterthwaite df, rounded down), and the exact two-sided rank-sum (Mann–Whitney) p.",
        "",
        "| comparison | model | difference [Welch 95 % CI] (seeds arm / baseline) | rank-sum p |",
        "|---|---|---:|---:|",
        *rows,
    ]


def _unpaired_cell(s: dict) -> str:
    lo, hi = s["ci95"]
    ci = "" if lo is None else f" [{100 * lo:+.1f}, {100 * hi:+.1f}]"
    return f"{100 * s['diff']:+.1f}{ci} ({s['n'][0]} / {s['n'][1]})"


def _p(p: float | None) -> str:
    return "–" if p is None else f"{p:.3f}"


def _paired_rows(plan: Plan, summary: dict, suffix: str) -> list[str]:
    """The paired table's rows as printed, one per comparison and model (equal rows: the same table)."""
    rows = []
    for c in plan.comparisons:
        diff, ci = summary.get(f"paired_diff_{c.name}{suffix}"), summary.get(f"paired_ci_{c.name}{suffix}") or {}
        for a, ds in (diff or {}).items():
            rows.append(
                f"| {plan.label(c.arm)} − {plan.label(c.baseline)} | {a} | "
                + ", ".join("–" if d is None else f"{100 * d:+.1f}" for d in ds)
                + f" | {_paired_ci(ci.get(a))} | {_detectable(ci.get(a))} |"
            )
    return rows


def decision_lines(plan: Plan, summary: dict) -> list[str]:
    """Each pre-registered decision's verdict, or how many pairs it still waits for."""
    md = []
    for c in plan.comparisons:
        d = summary.get(f"decision_{c.name}")
        if d is None:
            continue
        what = (
            f"Pre-registered decision ({c.name}): {plan.label(c.arm)} − {plan.label(c.baseline)} on {d['model']}, "
            f"confirmed iff the Student-t 95 % interval over {d['pairs_required']} paired seeds lies above 0: "
        )
        if d["verdict"] == "waits":
            md += ["", what + f"**verdict waits** ({d['n']} of {d['pairs_required']} pairs in; a partial set is not read)."]
        else:
            md += ["", what + f"**{d['verdict']}**: {_paired_ci(d)} points."]
    return md


def _paired_ci(s: dict | None) -> str:
    if not s or s.get("mean") is None:
        return "–"
    return f"{_ci(s) if s['ci95'][0] is not None else format(100 * s['mean'], '+.1f')} ({s['n']})"


def _detectable(s: dict | None) -> str:
    return "–" if not s or s.get("detectable") is None else f"{100 * s['detectable']:.1f}"


def _dataset_table(summary: dict) -> list[str]:
    md = [
        "",
        "## Per data set",
        "",
        "| arm | model | " + " | ".join(summary["eval"]["data"]) + " |",
        "|---|---|" + "---:|" * len(summary["eval"]["data"]),
    ]
    for arm, per in summary["by_dataset"].items():
        for a in summary["models"]:
            md.append(f"| {arm} | {a} | " + " | ".join(_fmt(_mean(v), _std(v)) for v in per[a].values()) + " |")
    return md


def _exchange_section(summary: dict) -> list[str]:
    """Per exchanging arm: responses admitted / transferred, graded correct by their source, the peer rows'
    share of the update, the steps with an exchange; then the peer-token clip rates."""
    md = ["", "## Exchange", ""]
    for arm, ex in summary["exchanged"].items():
        tr = summary.get("transferred", {}).get(arm, {})
        md.append(
            f"- {arm}: admitted / transferred peer responses per seed "
            + "; ".join(
                f"{d}: " + ", ".join("–" if a is None else f"{a}/{t}" for a, t in zip(v, tr.get(d, [None] * len(v)), strict=True))
                for d, v in ex.items()
            )
        )
        corr = summary.get("admitted_correct", {}).get(arm, {})
        if corr:
            md.append(
                "  - admitted responses the source graded correct, per seed: "
                + "; ".join(f"{d}: " + ", ".join("–" if x is None else str(x) for x in v) for d, v in corr.items())
            )
        share = summary.get("peer_row_share", {}).get(arm, {})
        if any(x is not None for v in share.values() for x in v):
            md.append(
                "  - peer rows' share of the update rows (mean over steps), per seed: "
                + "; ".join(f"{a}: " + ", ".join("–" if x is None else f"{100 * x:.2f} %" for x in v) for a, v in share.items())
            )
        for d, per_seed in summary.get("exchange_steps", {}).get(arm, {}).items():
            done = [x for x in per_seed if x]
            if done:
                md.append(
                    f"  - {d}: steps with a balanced target m > 0: {[x['with_target'] for x in done]}, with an "
                    f"admitted response: {[x['with_admitted'] for x in done]} (of {done[0]['steps']}); median s of "
                    "the responses transferred in the first → last third of training: "
                    + ", ".join(f"{_num2(x['s_median_first_third'])} → {_num2(x['s_median_last_third'])}" for x in done)
                )
    if summary["clip_frac_peer_by_model"]:
        md.append(
            "- peer-token clip rate (low + high, mean over steps with peer data): "
            + "; ".join(
                f"{k}: " + ", ".join(f"{a} {'–' if v is None else f'{100 * v:.2f}%'}" for a, v in d.items())
                for k, d in summary["clip_frac_peer_by_model"].items()
            )
        )
    return md


PLOTS = (
    ("Training reward", "rewards"),
    ("Complementarity (independent GRPO runs)", "complementarity"),
    ("Compatibility s", "s_hist"),
    ("Exchange sizes", "exchange"),
    ("Clip rates", "clip_rates"),
)
"""The report's plots in order: title, key of :func:`_plots`."""


def _last_quarter_table(summary: dict) -> list[str]:
    """Per arm and model, the training statistics STUDY.md's selection rule reads: the mean over the finished seeds
    (their count in brackets; each seed's numbers are in summary.json ``last_quarter``)."""
    cells = [(arm, a, [q for q in qs if q]) for arm, per in summary.get("last_quarter", {}).items() for a, qs in per.items()]
    cells = [c for c in cells if c[2]]
    if not cells:
        return []
    md = [
        "",
        "## Last quarter of training",
        "",
        "| arm | model | steps | mean strict reward [seeds] | mean distinct_frac | rewarded echo / example copy |",
        "|---|---|---|---:|---:|---:|",
    ]
    for arm, a, qs in cells:
        rewarded = sum(q["rewarded"] for q in qs)
        shares = [q["echo_or_copy_share"] for q in qs]
        flagged = None if None in shares else sum(x * q["rewarded"] for x, q in zip(shares, qs, strict=True))
        share = "–" if flagged is None else f"{100 * flagged / max(rewarded, 1):.0f} % of {rewarded}"
        distinct = [q["distinct_frac"] for q in qs]
        md.append(
            f"| {arm} | {a} | {qs[0]['steps'][0]}–{qs[0]['steps'][1]} | {_mean([q['reward'] for q in qs]):.3f} "
            f"[{len(qs)}] | {_num2(None if None in distinct else _mean(distinct))} | {share} |"
        )
    return md


def _one_step_section(summary: dict) -> list[str]:
    """The one-update paired test (``graft onestep``), when the plan names its summary."""
    if "one_step_effect" not in summary:
        return []
    md = [
        "",
        "## One update with vs without the peer groups (`graft onestep`)",
        "",
        "Difference in the receiver's success rate after one update, GRAFT's admitted peer groups minus its own "
        "groups only (gate off: `exchange.admission=all`), points, mean over prompts with a 95 % bootstrap interval "
        "over training states and prompts.",
        "",
        "| direction | prompts measured | GRAFT − GRPO | gate off − GRPO | prompts (states) | admitted (correct) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for d, kinds in summary["one_step_effect"].items():
        t = summary["one_step_treatment"].get(d, {})
        for kind, s in kinds.items():
            off = summary["one_step_effect_gate_off"].get(d, {}).get(kind, {})
            md.append(
                f"| {d} | {kind} | {_ci(s)} | {_ci(off)} | {s['prompts']} ({s['states']}) | "
                f"{t.get('admitted/graft', '–')} ({t.get('admitted_correct/graft', '–')}) |"
            )
    md += _one_step_t_rows(summary)
    st = summary.get("one_step_states")
    if st:
        rest = st["measured"] - st["with_exchange"]
        md += [
            "",
            f"Training states measured: {st['measured']}; {st['with_exchange']} had a prompt to exchange"
            + (
                f" (in the other {rest} no prompt was selected in either direction: GRAFT's update is GRPO's there)."
                if rest
                else "."
            ),
        ]
    return md


def _one_step_t_rows(summary: dict) -> list[str]:
    """The Student-t interval over state means (both arms) and the prompts that changed at all, for summaries that
    carry them (``graft onestep`` arms version 2); the verdict reads this interval (``one_step_verdict_interval``)."""
    rows = [(d, kind, s) for d, kinds in summary["one_step_effect"].items() for kind, s in kinds.items() if "t95" in s]
    if not rows:
        return []
    why = summary.get("one_step_verdict_interval", {}).get("why", "")
    md = [
        "",
        "The same differences as the mean of the training states' mean differences, with a Student-t 95 % interval "
        "over the states (df = states − 1)" + (f"; {why}." if why else "."),
        "",
        "| direction | prompts measured | GRAFT − GRPO (t) | gate off − GRPO (t) | prompts changed at all | states |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for d, kind, s in rows:
        off = summary["one_step_effect_gate_off"].get(d, {}).get(kind, {})
        md.append(
            f"| {d} | {kind} | {_ci(s['t95'])} | {_ci(off.get('t95', {}))} | {s['differed']} of {s['prompts']} | "
            f"{s['t95']['states']} |"
        )
    return md


def _ci(s: dict) -> str:
    if not s or s.get("mean") is None:
        return "–"
    if None in s["ci95"]:
        return f"{100 * s['mean']:+.1f} (one state: no interval)"
    return f"{100 * s['mean']:+.1f} [{100 * s['ci95'][0]:+.1f}, {100 * s['ci95'][1]:+.1f}]"


def _plot_sections(plots: dict[str, str]) -> list[str]:
    md = []
    if plots:
        md += [
            "",
            "The plots below show one run per arm, its lowest seed (the stored-peer runs are left out); "
            "every seed's numbers are in the tables above and in summary.json.",
        ]
    for title, key in PLOTS:
        if plots.get(key):
            md += ["", f"## {title}", "", f"![{title}]({plots[key]})"]
    return md


def _commands(plan: Plan) -> list[str]:
    return [
        "",
        "## Commands",
        "",
        "```",
        f"graft experiment run {plan_path_hint(plan)}",
        f"graft experiment summarize {plan_path_hint(plan)}",
        "```",
        "",
        "Each run's exact `graft train` / `graft eval` command is printed by `graft experiment run` before it "
        "starts; `results/.../runs/ARM/seedS/config.yaml` is the resolved config.",
    ]


def strict_section(plan: Plan, summary: dict) -> list[str]:
    """The eval responses re-graded with the strict rule, the reward monitor of the answers each run's own
    grading rewarded, and strict pass@1 per problem family beside its chance level."""
    A, strict = summary["models"], summary.get("arms_answer_form_number", {})
    if not any(x is not None for per in strict.values() for xs in per.values() for x in xs):
        return []
    skill = summary.get("arms_strict_skill", {})
    md = [
        "",
        "## Strict re-grade",
        "",
        "Every kept eval response re-graded with the strict rule (`reward.answer_form=number`: exactly one final "
        "answer, the reference in lowest terms — `\\boxed{192/4}` for 48, `\\boxed{27*18}` and "
        "`\\boxed{117} or \\boxed{228}` score 0). *Skill only* leaves out the families whose chance level — the "
        f"reward of boxing a number of the question — is at least {CHANCE_FAMILY:.0%} (`max`: 50 %). "
        "The plan's own grading is the table above.",
        "",
        "| arm | " + " | ".join(f"{a} strict | {a} skill only" for a in A) + " |",
        "|---|" + "---:|" * (2 * len(A)),
    ]
    for arm, per in strict.items():
        md.append(
            f"| {arm} | " + " | ".join(f"{_seed_cells(per[a])} | {_seed_cells(skill.get(arm, {}).get(a, []))}" for a in A) + " |"
        )
    for a in A:
        xs = [x for x in summary.get("stored_answer_form_number", {}).get(a, []) if x is not None]
        if xs:
            md.append(
                f"| stored peer ({a} receives) | " + " | ".join(f"{_fmt(_mean(xs))} | " if b == a else " | " for b in A) + " |"
            )
    strict_rows = _paired_rows(plan, summary, "_number")
    paired = (
        ["", "Paired differences with the strict rule: the same as with the plan's own grading (below)."]
        if strict_rows and strict_rows == _paired_rows(plan, summary, "")
        else _paired_lines(plan, summary, "_number", ", strict")
    )
    return md + paired + _monitor_table(summary) + _family_table(summary)


def _monitor_table(summary: dict) -> list[str]:
    """Per arm and model, the shares of shortcut answers among those the run's own grading rewarded."""
    md = [
        "",
        "## Reward monitor",
        "",
        "Among the eval answers each run's own grading rewarded: the share that box an operator, a fraction, a "
        "number of the question, box twice, copy a worked example or echo the question (%, mean over seeds; "
        "*rewarded*: their count, summed over seeds). A share far above the honest runs' is a shortcut.",
        "",
        "| arm | model | rewarded | " + " | ".join(FLAGS) + " |",
        "|---|---|---:|" + "---:|" * len(FLAGS),
    ]
    for arm, per in summary.get("monitor", {}).items():
        for a in summary["models"]:
            mons = [x["as_run"] for x in per.get(a, []) if x]
            if not mons:
                continue
            cells = [_fmt(_mean([x[f] for x in mons if x[f] is not None])) for f in FLAGS]
            md.append(f"| {arm} | {a} | {sum(x['n'] for x in mons)} | " + " | ".join(cells) + " |")
    return md


def _family_table(summary: dict) -> list[str]:
    """Strict pass@1 per problem family (mean over seeds, per arm and model) beside its chance level."""
    A, fams = summary["models"], summary.get("families", {})
    names = sorted({f for per in fams.values() for xs in per.values() for x in xs if x for f in x})
    if not names:
        return []
    md = [
        "",
        "Strict pass@1 (%) per problem family, mean over seeds (" + " / ".join(A) + "), and the family's "
        "chance level on the eval prompts:",
        "",
        "| family | chance | " + " | ".join(fams) + " |",
        "|---|---:|" + "---:|" * len(fams),
    ]
    for f in names:
        chance = next((x[f]["chance"] for per in fams.values() for xs in per.values() for x in xs if x and f in x), None)
        cells = [
            " / ".join(
                _fmt(
                    _mean([x[f]["pass@1"] for x in per.get(a, []) if x and f in x])
                    if any(x and f in x for x in per.get(a, []))
                    else None
                )
                for a in A
            )
            for per in fams.values()
        ]
        md.append(f"| {f} | {_fmt(chance)} | " + " | ".join(cells) + " |")
    return md


def write_summary(plan: Plan) -> Path:
    """Write the plan's summary.json, plots and REPORT.md under its results folder."""
    summary = summarize(plan)
    plan.results.mkdir(parents=True, exist_ok=True)
    (plan.results / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (plan.results / "REPORT.md").write_text(report_markdown(plan, summary, _plots(plan)))
    return plan.results / "summary.json"


def _plots(plan: Plan) -> dict[str, str]:
    """The report's plots of each arm's lowest finished seed (stored-peer runs left out): key -> file name."""
    lowest = [
        m
        for m in plan.members
        if m.store is None and (m.results_dir / "metrics.jsonl").is_file() and m.seed == min(plan_seeds(plan, m.arm))
    ]
    runs = [(m, compute_analysis(m.results_dir)) for m in lowest]
    if not runs:
        return {}
    named = [(m.arm, analysis) for m, analysis in runs]
    plots = {
        "rewards": rep.plot_rewards(named, plan.results),
        "s_hist": rep.plot_s_hist(named, plan.results),
        "exchange": rep.plot_exchange(named, plan.results),
        "clip_rates": rep.plot_clip_rates(named, plan.results),
    }
    alone = [(m.arm, analysis) for m, analysis in runs if not m.exchanges]
    if alone:
        plots["complementarity"] = rep.plot_complementarity(alone, plan.results)
    return plots
