"""``graft report RUN_DIR [RUN_DIR ...] [--out DIR]``: a markdown report with PNG plots.

The report is one folder: ``report.md`` plus the PNGs it references by relative path, so it
can be copied or zipped as is. Several runs (e.g. GRPO vs GRAFT) are overlaid in every plot
(legend ``RUN:MODEL``) and compared in a side-by-side table that also lists the config
fields whose values differ. Numbers come from :func:`graft.evaluation.analyze.compute_analysis`
(nothing is written into the run folders).

Plots (always written, with a "no data" note when a run has none of that kind, except
``eval.png`` which exists only when some run logged ``eval/...`` metrics):

==================  ==================================================================
rewards.png         mean training reward per step, per model
training.png        loss, gradient norm, sampler entropy and response length (mean, min-max band) per step
eval.png            in-training evaluation pass@1 per model and dataset
complementarity.png complementarity S->R per step (share of R's all-fail prompts S solved)
s_hist.png          histogram of the compatibility score s of transferred responses, gate δ marked
clip_rates.png      clip fractions own/peer × low/high per model
exchange.png        candidate-set size before / after balancing and admitted fraction per step
compute.png         accuracy (eval pass@1, else training reward) vs wall-clock and vs tokens generated
==================  ==================================================================
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from graft.evaluation.analyze import AnalysisError, complementarity_matrix, compute_analysis, read_config, read_metrics

PLOTS = (
    "rewards.png",
    "training.png",
    "eval.png",
    "complementarity.png",
    "s_hist.png",
    "clip_rates.png",
    "exchange.png",
    "compute.png",
)


def _labels(run_dirs: Sequence[Path]) -> list[str]:
    names = [p.resolve().name or str(p) for p in run_dirs]
    return [f"{n}#{i + 1}" if names.count(n) > 1 else n for i, n in enumerate(names)]


def _no_data(ax, text: str = "no data") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")


def _legend(ax, fontsize: int) -> None:
    """A legend only when the axes hold labelled artists (matplotlib warns on an empty one)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=fontsize)


def _finish(fig: Figure, path: Path) -> str:
    fig.savefig(path, dpi=110)
    return path.name


def _step_axis(ax) -> None:
    """Steps are integers: ticks only at whole steps."""
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _pairs(steps, values):
    pts = [(s, v) for s, v in zip(steps, values, strict=True) if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return [s for s, _ in pts], [v for _, v in pts]


def plot_rewards(runs, out: Path) -> str:
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    any_data = False
    for label, a in runs:
        for m, r in a["rewards"].items():
            if r["steps"]:
                ax.plot(r["steps"], r["reward"], label=f"{label}:{m}", marker="." if len(r["steps"]) < 30 else None)
                any_data = True
    if any_data:
        _legend(ax, 8)
    else:
        _no_data(ax)
    ax.set(ylabel="mean reward", title="Training reward per model")
    _step_axis(ax)
    ax.grid(alpha=0.3)
    return _finish(fig, out / "rewards.png")


TRAINING_PANELS = (
    ("loss", "loss"),
    ("grad_norm", "gradient norm"),
    ("entropy/mean", "entropy (nats/token)"),
    ("response_length/mean", "response length (tokens)"),
)
"""(metrics.jsonl key of model M without ``M/``, axis label) of each panel of ``training.png``."""


def plot_training(runs_rows, out: Path) -> str:
    """``training.png``: :func:`training_figure`."""
    return _finish(training_figure(runs_rows), out / "training.png")


def training_figure(runs_rows) -> Figure:
    """:data:`TRAINING_PANELS` per step for every (label, models, metrics rows) of ``runs_rows``; the
    response-length panel shades each model's min-max range."""
    fig = Figure(figsize=(10, 6.5), layout="constrained")
    axes = fig.subplots(2, 2, sharex=True).ravel()
    for ax, (key, label) in zip(axes, TRAINING_PANELS, strict=True):
        any_data = False
        for run_label, models, rows in runs_rows:
            for m in models:
                steps, vals = _pairs([r.get("step") for r in rows], [r.get(f"{m}/{key}") for r in rows])
                if not steps:
                    continue
                (line,) = ax.plot(steps, vals, label=f"{run_label}:{m}", marker="." if len(steps) < 30 else None)
                any_data = True
                if key == "response_length/mean":
                    band = [
                        (r["step"], r.get(f"{m}/response_length/min"), r.get(f"{m}/response_length/max"))
                        for r in rows
                        if r.get(f"{m}/response_length/min") is not None
                    ]
                    if band:
                        ax.fill_between(
                            [b[0] for b in band], [b[1] for b in band], [b[2] for b in band], color=line.get_color(), alpha=0.15
                        )
        if any_data:
            _legend(ax, 7)
        else:
            _no_data(ax)
        ax.set(ylabel=label, title=label[0].upper() + label[1:])
        ax.grid(alpha=0.3)
        _step_axis(ax)
    return fig


def plot_eval(runs, out: Path) -> str | None:
    if not any(a["eval"] for _, a in runs):
        return None
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    for label, a in runs:
        for key, e in a["eval"].items():
            ax.plot(e["steps"], [100 * v for v in e["values"]], marker="o", label=f"{label}:{key.removeprefix('eval/')}")
            if e["best_step"] is not None and e["best"] is not None:
                ax.scatter([e["best_step"]], [100 * e["best"]], marker="*", s=120, zorder=3)
    _legend(ax, 8)
    ax.set(ylabel="pass@1 (%)", title="Evaluation during training (★ = best checkpoint)")
    _step_axis(ax)
    ax.grid(alpha=0.3)
    return _finish(fig, out / "eval.png")


def plot_complementarity(runs, out: Path) -> str:
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    any_data = False
    for label, a in runs:
        for d, c in a["complementarity"].items():
            xs, ys = _pairs([r["step"] for r in c["per_step"]], [r["value"] for r in c["per_step"]])
            if xs:
                overall = c["overall"]
                tag = f" (overall {100 * overall:.1f}%)" if overall is not None else ""
                ax.plot(xs, [100 * y for y in ys], marker="." if len(xs) < 30 else None, label=f"{label}:{d}{tag}")
                any_data = True
    if any_data:
        _legend(ax, 8)
    else:
        _no_data(ax, "no complementarity data (needs two models)")
    _step_axis(ax)
    ax.set(ylabel="% of receiver's all-fail prompts solved by source", title="Complementarity S->R over training")
    ax.grid(alpha=0.3)
    return _finish(fig, out / "complementarity.png")


def plot_s_hist(runs, out: Path) -> str:
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    any_data = False
    deltas = set()
    for label, a in runs:
        if a.get("delta") is not None:
            deltas.add(float(a["delta"]))
        for d, s in a["s"].items():
            if d == "all" and len([k for k in a["s"] if k != "all"]) > 0:
                continue
            ax.stairs(s["histogram"]["counts"], s["histogram"]["edges"], label=f"{label}:{d} (n={s['count']})")
            any_data = True
    for dl in sorted(deltas):
        ax.axvline(dl, color="red", linestyle="--", label=f"gate δ = {dl:g}")
    if any_data or deltas:
        _legend(ax, 8)
    if not any_data:
        _no_data(ax, "no transferred responses (no exchange)")
    ax.set(xlabel="compatibility score s (last bin: s ≥ 2)", ylabel="responses", title="Distribution of s")
    ax.grid(alpha=0.3)
    return _finish(fig, out / "s_hist.png")


def plot_clip_rates(runs, out: Path) -> str:
    fig = Figure(figsize=(10, 6), layout="constrained")
    axes = fig.subplots(2, 2, sharex=True)
    for ax, kind in zip(axes.flat, ("own_low", "own_high", "peer_low", "peer_high"), strict=True):
        any_data = False
        for label, a in runs:
            for m, c in a["clip"].items():
                rows = c["per_step"]
                if kind.startswith("peer"):  # steps without peer data log 0; leave them out
                    rows = [r for r in rows if r["peer_responses"] is None or r["peer_responses"] > 0]
                xs, ys = _pairs([r["step"] for r in rows], [r[kind] for r in rows])
                if xs:
                    ax.plot(xs, [100 * y for y in ys], marker="." if len(xs) < 30 else None, label=f"{label}:{m}")
                    any_data = True
        if any_data:
            _legend(ax, 7)
        else:
            _no_data(ax)
        ax.set(title=f"clip rate {kind.replace('_', ' ')}", ylabel="% of tokens")
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        _step_axis(ax)
    return _finish(fig, out / "clip_rates.png")


def plot_exchange(runs, out: Path) -> str:
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    any_data = False
    for label, a in runs:
        for d, e in a["exchange"].items():
            ps = e["per_step"]
            xs, ys = _pairs([p["step"] for p in ps], [p["candidates"] for p in ps])
            if xs:
                (line,) = ax1.plot(xs, ys, label=f"{label}:{d} |C| before")
                xk, yk = _pairs([p["step"] for p in ps], [p["kept"] for p in ps])
                ax1.plot(xk, yk, linestyle="--", color=line.get_color(), label=f"{label}:{d} kept after")
                any_data = True
            xa, ya = _pairs([p["step"] for p in ps], [p["admitted_frac"] for p in ps])
            if xa:
                ax2.plot(xa, [100 * y for y in ya], marker="." if len(xa) < 30 else None, label=f"{label}:{d}")
    for ax in (ax1, ax2):
        if any_data:
            _legend(ax, 7)
        else:
            _no_data(ax, "no exchange")
        ax.grid(alpha=0.3)
        _step_axis(ax)
    ax1.set(ylabel="prompts", title="Candidate set before / after balancing")
    ax2.set(ylabel="% of transferred responses", title="Admitted fraction")
    return _finish(fig, out / "exchange.png")


def _accuracy_series(a: dict) -> tuple[str, dict[str, tuple[list, list]]]:
    """(y label, {name: (steps, values)}): eval pass@1 curves when logged, else training reward."""
    ev = {k: (e["steps"], [100 * v for v in e["values"]]) for k, e in a["eval"].items() if k.endswith("/pass@1")}
    if ev:
        return "eval pass@1 (%)", {k.removeprefix("eval/"): v for k, v in ev.items()}
    return "training reward", {m: (r["steps"], r["reward"]) for m, r in a["rewards"].items()}


def plot_compute(runs, out: Path) -> str:
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    ylabels = set()
    any_data = False
    for label, a in runs:
        comp = a["compute"]
        at = {s: (w, t) for s, w, t in zip(comp["steps"], comp["wall_s"], comp["tokens"], strict=True)}
        ylabel, series = _accuracy_series(a)
        ylabels.add(ylabel)
        for name, (steps, vals) in series.items():
            pts = [(at[s], v) for s, v in zip(steps, vals, strict=True) if s in at and v is not None]
            if not pts:
                continue
            ax1.plot([p[0][0] / 3600 for p in pts], [p[1] for p in pts], marker=".", label=f"{label}:{name}")
            ax2.plot([p[0][1] for p in pts], [p[1] for p in pts], marker=".", label=f"{label}:{name}")
            any_data = True
    ylabel = " / ".join(sorted(ylabels)) or "accuracy"
    for ax in (ax1, ax2):
        if any_data:
            _legend(ax, 7)
        else:
            _no_data(ax)
        ax.grid(alpha=0.3)
        ax.set_ylabel(ylabel)
    ax1.set(xlabel="wall-clock (hours, cumulative time/step_s)", title="Accuracy vs wall-clock")
    ax2.set(xlabel="tokens generated (cumulative, all models)", title="Accuracy vs tokens generated")
    return _finish(fig, out / "compute.png")


# ----------------------------------------------------------------------------- tables


def _flatten(d, prefix="") -> dict:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out |= _flatten(v, f"{prefix}{k}.")
    elif isinstance(d, list) and d and all(isinstance(x, dict) for x in d):
        for i, v in enumerate(d):
            out |= _flatten(v, f"{prefix}{i}.")
    else:
        out[prefix[:-1]] = d
    return out


def config_differences(configs: Sequence[dict]) -> dict[str, list]:
    """Dotted config keys whose values differ between runs (``run_dir`` excluded) -> values per run."""
    flats = [_flatten(c) for c in configs]
    keys = sorted(set().union(*flats)) if flats else []
    return {k: [f.get(k) for f in flats] for k in keys if k != "run_dir" and len({repr(f.get(k)) for f in flats}) > 1}


def _p(v, digits=2) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.{digits}f}%"


def _n(v, spec=".3f") -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def comparison_table(runs) -> list[str]:
    """One row per (run, model): reward, eval, exchange as receiver, clip rates, compute."""
    lines = [
        "| run | mode | model | final reward | best eval pass@1 (step) | complementarity peer→model | "
        "received: kept prompts / transferred / admitted | mean s received | peer clip low / high | "
        "wall-clock | tokens generated |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, a in runs:
        comp = a["compute"]
        for m in a["models"]:
            r = a["rewards"].get(m, {})
            ev = [e for k, e in a["eval"].items() if k.startswith(f"eval/{m}/") and k.endswith("/pass@1")]
            ev_txt = ", ".join(f"{_p(e['best'])} ({e['best_step']})" for e in ev) or "–"
            into = [d for d in a["complementarity"] if d.endswith(f"->{m}") and "->" in d and ":" not in d]
            comp_txt = ", ".join(_p(a["complementarity"][d]["overall"], 1) for d in into) or "–"
            ex = [e["totals"] for d, e in a["exchange"].items() if d.endswith(f"->{m}")]
            ex_txt = (
                " ; ".join(f"{t['kept']} / {t['transferred']} / {t['admitted']} ({_p(t['admitted_frac'], 1)})" for t in ex) or "–"
            )
            s_recv = [s for d, s in a["s"].items() if d != "all" and d.endswith(f"->{m}")]
            s_txt = ", ".join(_n(s["mean"]) for s in s_recv) or "–"
            c = a["clip"].get(m, {})
            clip_txt = f"{_p(c.get('peer_low'), 3)} / {_p(c.get('peer_high'), 3)}"
            wall = f"{comp['wall_s'][-1] / 3600:.2f} h" if comp["wall_s"] else "–"
            tok = f"{comp['tokens_by_model'][m][-1]:.0f}" if comp["tokens_by_model"].get(m) else "–"
            lines.append(
                f"| {label} | {a['mode']} | {m} | {_n(r.get('final'))} | {ev_txt} | {comp_txt} | {ex_txt} | "
                f"{s_txt} | {clip_txt} | {wall} | {tok} |"
            )
    return lines


SECTIONS = [
    ("Reward curves", "rewards", "Mean training reward per step for each model."),
    (
        "Training curves",
        "training",
        "Policy loss, gradient norm (mean over the step's minibatches), per-token "
        "entropy of the sampler on its own samples, and response length (line: "
        "mean; band: shortest to longest) per step.",
    ),
    (
        "Evaluation accuracy",
        "eval",
        "In-training pass@1 on the validation set; ★ marks the best checkpoint (highest pass@1, ties to the earlier step).",
    ),
    (
        "Complementarity over training",
        "complementarity",
        "Share of the receiver's all-fail prompts on which the source had at least one success, per step.",
    ),
    (
        "Compatibility score s",
        "s_hist",
        "Histogram of s over all transferred responses; responses with s ≤ δ (dashed line) are dropped.",
    ),
    (
        "Clip rates",
        "clip_rates",
        "Fraction of own and peer tokens whose ratio was clipped below 1-ε_low (low) or above 1+ε_high (high).",
    ),
    (
        "Exchange sizes",
        "exchange",
        "Candidate-set size |C_{S->R}| before balancing, kept prompts after balancing, "
        "and the share of transferred responses admitted by the gate.",
    ),
    (
        "Accuracy vs compute",
        "compute",
        "Eval pass@1 (training reward when no evaluation was logged) against cumulative wall-clock and tokens generated.",
    ),
]
"""The report's figures: (title, plot key, caption)."""


def report(run_dirs: Sequence[str | Path], out: str | Path) -> Path:
    """Write ``out/report.md`` and its PNGs for one or more runs; returns the markdown path."""
    dirs = [Path(p) for p in run_dirs]
    if not dirs:
        raise AnalysisError("give at least one run folder")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise AnalysisError(f"{out}: is a file; the report needs a folder (--out DIR)")
    out.mkdir(parents=True, exist_ok=True)
    labels = _labels(dirs)
    runs = [(label, compute_analysis(p)) for label, p in zip(labels, dirs, strict=True)]
    plots = {
        "rewards": plot_rewards(runs, out),
        "training": plot_training([(label, a["models"], read_metrics(p)) for (label, a), p in zip(runs, dirs, strict=True)], out),
        "eval": plot_eval(runs, out),
        "complementarity": plot_complementarity(runs, out),
        "s_hist": plot_s_hist(runs, out),
        "clip_rates": plot_clip_rates(runs, out),
        "exchange": plot_exchange(runs, out),
        "compute": plot_compute(runs, out),
    }
    md = _summary_lines(runs, dirs)
    if len(runs) > 1:
        md += _config_diff_lines(config_differences([read_config(p) for p in dirs]), labels)
    for title, key, caption in SECTIONS:
        md += ["", f"## {title}", ""]
        if plots[key] is None:
            md.append("No in-training evaluation was logged (set `eval.every` and `data.val`).")
        else:
            md += [caption, "", f"![{title}]({plots[key]})"]
    for label, a in runs:
        md += _numbers_lines(label, a)
    path = out / "report.md"
    path.write_text("\n".join(md) + "\n")
    return path


def _summary_lines(runs: list[tuple[str, dict]], run_dirs: list[Path]) -> list[str]:
    md = ["# graft report", ""]
    md += ["| run | folder | mode | models | steps logged |", "|---|---|---|---|---:|"]
    for (label, a), p in zip(runs, run_dirs, strict=True):
        md.append(f"| {label} | `{p}` | {a['mode']} | {', '.join(a['models'])} | {a['steps']} |")
    for label, a in runs:
        md += [f"- {label}: {line.strip()}" for line in a.get("exchange_description") or []]
    md += [
        "",
        "## Summary",
        "",
        "Final reward = mean of the last 5 logged steps. Complementarity = share of the model's all-fail "
        "prompts that the peer solved, pooled over training. Clip rates are means over steps (peer: over steps "
        "with peer data).",
        "",
    ]
    return md + comparison_table(runs)


def _config_diff_lines(diffs: dict, labels: list[str]) -> list[str]:
    md = ["", "### Config differences", ""]
    if not diffs:
        return md + ["The runs have identical configs (apart from run_dir)."]
    md += ["| field | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    return md + [f"| `{k}` | " + " | ".join(f"`{v}`" for v in vals) + " |" for k, vals in diffs.items()]


def _numbers_lines(label: str, a: dict) -> list[str]:
    if not (a["s"] or a["complementarity"]):
        return []
    md = ["", f"### Numbers: {label}", ""]
    matrix = complementarity_matrix(a)
    if matrix:
        md += [
            "Complementarity matrix (row: source, column: receiver; share of the receiver's all-fail "
            "prompts the source solved, pooled over training):",
            "",
            *matrix,
            "",
        ]
    for d, c in a["complementarity"].items():
        md.append(f"- complementarity {d}: {_p(c['overall'], 1)} overall ({c['source']})")
    for d, s in a["s"].items():
        q = s["quantiles"]
        md.append(
            f"- s {d}: n={s['count']}, p10 {_n(q['p10'])}, median {_n(q['p50'])}, p90 {_n(q['p90'])}, "
            f"above δ {_p(s['above_delta_frac'], 1)}"
        )
    return md
