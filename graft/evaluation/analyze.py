"""``graft analyze RUN_DIR``: the paper's analysis numbers from a finished (or running) run.

Inputs (docs/design.md): ``metrics.jsonl``, ``audit.jsonl``, ``config.yaml`` and, when
present, the Parquet trajectory store ``trajectories/``. Output: ``RUN_DIR/analysis.json``
(NaN written as null) and a printed summary. Everything is optional except metrics.jsonl:
a GRPO run (``exchange.kind: none``) has no exchange entries and still gets complementarity, clip rates and
reward curves.

Definitions
-----------
* **Complementarity S->R** = fraction of R's all-fail prompts (k_R = 0) on which S had at
  least one success (k_S >= 1; a success is a reward above the run's ``reward.success_threshold``, read off its
  ``config.yaml``; with ``--against``, each run's own). Source ``store``: recomputed from the stored rewards, over the
  prompts both models answered at the same step; *overall* pools every (step, prompt) pair
  (solved / all-fail summed over steps, the paper's Figure 1 number). Source ``metrics``
  (no store): the logged ``complementarity/S->R``; overall = their average weighted by R's
  ``all_fail_frac`` of each step (equal to pooling when the batch size is constant).
* **Candidate sets**: |C_{S->R}| before balancing (``candidates``), the balanced target ``m``
  and the kept prompts after balancing (``kept``; ties can make it exceed m), from the audit
  log (metrics as fallback).
* **Admitted fraction** = admitted / transferred peer responses (per step and pooled).
* **s distribution** of every transferred response (audit ``s``): quantiles (linear
  interpolation) and histogram counts on fixed edges 0, 0.05, ..., 2.0; bin i counts
  ``edges[i] <= s < edges[i+1]``, the last bin also counts every s >= 2.0.
* **Clip rates** per model: mean over steps of ``M/clip_frac/{own,peer}_{low,high}``; the peer
  rates average only steps where the model trained on peer responses (``M/peer_responses > 0``),
  since the trainer logs 0 when there are no peer tokens. ``peer_zero_clip_step_frac`` = share of
  those steps with no clipped peer token at all (paper Table 9: 97.6% with peer-first order).
"""

from __future__ import annotations

import bisect
import json
import math
import random
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml

from graft.config import ConfigError, load_config, run_success_threshold, success_threshold_of
from graft.config.coerce import build
from graft.domains.base import config_domain
from graft.evaluation.evaluate import best_checkpoint, json_clean
from graft.evaluation.metrics import complementarity_counts
from graft.exchange.kinds import ExchangeDescription, describe_exchange
from graft.registry import TASKS
from graft.reward.shortcuts import FLAGS, chance_level
from graft.storage.trajectory_store import TrajectoryStore
from graft.success import succeeded

S_EDGES = [round(0.05 * i, 2) for i in range(41)]
"""Histogram edges of the compatibility score s."""
QUANTILES = (0.0, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0)
FINAL_WINDOW = 5
"""``final`` reward = mean of the last this-many logged steps."""


class AnalysisError(RuntimeError):
    """A run folder that cannot be analysed; the message says why."""


# ----------------------------------------------------------------------------- reading


def read_jsonl(path: Path) -> list[dict]:
    """JSON objects of a JSONL file; a torn (unparsable) line is skipped."""
    if not Path(path).exists():
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def read_metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl rows by step (a step logged twice keeps its last row, as after a resume)."""
    by_step: dict[int, dict] = {}
    for row in read_jsonl(Path(run_dir) / "metrics.jsonl"):
        if "step" in row:
            by_step[int(row["step"])] = row
    return [by_step[s] for s in sorted(by_step)]


def read_config(run_dir: Path) -> dict:
    p = Path(run_dir) / "config.yaml"
    if not p.exists():
        return {}
    try:
        return yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError:
        return {}


def _num(v) -> float | None:
    """A finite float or None (metrics write NaN as null)."""
    if v is None or isinstance(v, bool):
        return None if v is None else float(v)
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) or math.isinf(f) else f


def _int(v) -> int | None:
    f = _num(v)
    return None if f is None else int(round(f))


def _mean(vals: Sequence[float | None]) -> float | None:
    xs = [v for v in vals if v is not None]
    return sum(xs) / len(xs) if xs else None


def model_names(cfg: dict, rows: list[dict]) -> list[str]:
    names: list[str] = [m["name"] for m in (cfg.get("models") or []) if isinstance(m, dict) and m.get("name")]
    if names:
        return names
    found = []
    for row in rows:
        for k in row:
            m = re.match(r"^([^/]+)/reward/mean$", k)
            if m and m.group(1) not in found:
                found.append(m.group(1))
    return found


def directions(models: list[str], rows: list[dict], audit: list[dict]) -> list[str]:
    """Exchange directions "S->R": every ordered pair of the models, plus any found in the logs."""
    out = [f"{a}->{b}" for a in models for b in models if a != b] if len(models) >= 2 else []
    for rec in audit:
        d = f"{rec.get('source')}->{rec.get('receiver')}"
        if d not in out:
            out.append(d)
    for row in rows:
        for k in row:
            m = re.match(r"^(?:exchange|complementarity)/([^/]+->[^/]+)", k)
            if m and m.group(1) not in out:
                out.append(m.group(1))
    return out


def read_store_counts(
    run_dir: Path, threshold: float, models: Sequence[str] | None = None
) -> dict[tuple[str, int, str], int] | None:
    """Success counts k[(model, step, prompt_id)] from the trajectory store (rewards above ``threshold``, the run's
    ``reward.success_threshold``); None when there is no store."""
    root = Path(run_dir) / "trajectories"
    if not root.is_dir() or not any(root.glob("step_*.parquet")):
        return None

    table = TrajectoryStore(root).read(models=models, columns=["model", "step", "prompt_id", "reward"])
    cols = {c: table[c].to_pylist() for c in ("model", "step", "prompt_id", "reward")}
    k: dict[tuple[str, int, str], int] = {}
    for m, s, p, r in zip(cols["model"], cols["step"], cols["prompt_id"], cols["reward"], strict=True):  # columns of one table
        key = (m, int(s), p)
        k[key] = k.get(key, 0) + (1 if r is not None and succeeded(r, threshold) else 0)
    return k


# ----------------------------------------------------------------------------- pieces


def complementarity_from_counts(k: dict[tuple[str, int, str], int], direction: str) -> dict:
    """Per step and pooled complementarity S->R from store success counts."""
    src, recv = direction.split("->")
    steps: dict[int, tuple[list[int], list[int]]] = {}
    for (m, step, pid), kr in k.items():
        if m != recv or (src, step, pid) not in k:
            continue
        kr_list, ks_list = steps.setdefault(step, ([], []))
        kr_list.append(kr)
        ks_list.append(k[(src, step, pid)])
    per_step, solved_tot, fail_tot = [], 0, 0
    for step in sorted(steps):
        solved, fail = complementarity_counts(*steps[step])
        solved_tot, fail_tot = solved_tot + solved, fail_tot + fail
        per_step.append(
            {
                "step": step,
                "value": solved / fail if fail else None,
                "solved": solved,
                "receiver_all_fail": fail,
                "prompts": len(steps[step][0]),
            }
        )
    return {
        "per_step": per_step,
        "overall": solved_tot / fail_tot if fail_tot else None,
        "solved": solved_tot,
        "receiver_all_fail": fail_tot,
        "mean_of_steps": _mean([r["value"] for r in per_step]),
    }


def complementarity_from_metrics(rows: list[dict], direction: str) -> dict:
    recv = direction.split("->")[1]
    per_step, num, den = [], 0.0, 0.0
    for row in rows:
        v = _num(row.get(f"complementarity/{direction}"))
        w = _num(row.get(f"{recv}/all_fail_frac"))
        if f"complementarity/{direction}" not in row:
            continue
        per_step.append({"step": row["step"], "value": v})
        if v is not None:
            weight = w if w is not None else 1.0
            num, den = num + v * weight, den + weight
    return {"per_step": per_step, "overall": num / den if den else None, "mean_of_steps": _mean([r["value"] for r in per_step])}


def exchange_stats(rows: list[dict], audit: list[dict], direction: str) -> dict:
    """Candidate-set sizes before/after balancing and admission per step, and totals."""
    src, recv = direction.split("->")
    recs = {int(r["step"]): r for r in audit if r.get("source") == src and r.get("receiver") == recv}
    per_step: list[dict[str, Any]] = []
    for row in rows:
        step = int(row["step"])
        pre = f"exchange/{direction}"
        rec = recs.get(step)
        if rec is None and not any(k.startswith(pre + "/") for k in row):
            continue
        per_step.append(_audit_entry(step, rec) if rec is not None else _metrics_entry(step, row, pre))
    steps_seen = {e["step"] for e in per_step}
    for step, rec in sorted(recs.items()):  # audit records of steps missing from metrics (still running)
        if step not in steps_seen:
            per_step.append(_audit_entry(step, rec))
    per_step.sort(key=lambda e: e["step"])
    return {"per_step": per_step, "totals": _exchange_totals(per_step)}


def _audit_entry(step: int, rec: dict) -> dict[str, Any]:
    """:func:`exchange_stats`' numbers of one step, from the step's audit record of the direction."""
    responses = rec.get("responses") or []
    adm = sum(1 for x in responses if x.get("admitted"))
    return {
        "step": step,
        "candidates": len(rec.get("candidates") or []),
        "m": rec.get("m"),
        "kept": len(rec.get("selected") or []),
        "transferred": len(responses),
        "admitted": adm,
        "admitted_frac": adm / len(responses) if responses else None,
    }


def _metrics_entry(step: int, row: dict, pre: str) -> dict[str, Any]:
    """:func:`exchange_stats`' numbers of one step, from its metrics row (the ``pre/...`` keys)."""
    entry: dict[str, Any] = {
        "step": step,
        "candidates": _int(row.get(f"{pre}/candidates")),
        "m": _int(row.get(f"{pre}/m")),
        "kept": _int(row.get(f"{pre}/kept_prompts")),
        "transferred": _int(row.get(f"{pre}/transferred")),
        "admitted": _int(row.get(f"{pre}/admitted")),
    }
    t, a = entry["transferred"], entry["admitted"]
    entry["admitted_frac"] = a / t if t and a is not None else None
    return entry


def _exchange_totals(per_step: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`exchange_stats`' totals over its steps (a number missing from a step counts as none)."""

    def total(key):
        return sum(e[key] for e in per_step if e[key] is not None)

    transferred, admitted = total("transferred"), total("admitted")
    return {
        "steps": len(per_step),
        "candidates": total("candidates"),
        "kept": total("kept"),
        "transferred": transferred,
        "admitted": admitted,
        "admitted_frac": admitted / transferred if transferred else None,
        "mean_candidates": _mean([e["candidates"] for e in per_step]),
        "mean_kept": _mean([e["kept"] for e in per_step]),
        "steps_with_exchange": sum(1 for e in per_step if (e["kept"] or 0) > 0),
    }


def quantile(sorted_vals: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of an ascending list."""
    if not sorted_vals:
        return math.nan
    pos = q * (len(sorted_vals) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def s_distribution(values: Sequence[float], delta: float | None) -> dict:
    vals = sorted(float(v) for v in values if v is not None and not math.isnan(float(v)))
    counts = [0] * (len(S_EDGES) - 1)
    for v in vals:
        counts[min(max(bisect.bisect_right(S_EDGES, v) - 1, 0), len(counts) - 1)] += 1
    return {
        "count": len(vals),
        "mean": sum(vals) / len(vals) if vals else None,
        "quantiles": {f"p{round(q * 100)}": (quantile(vals, q) if vals else None) for q in QUANTILES},
        "above_delta_frac": (sum(v > delta for v in vals) / len(vals)) if vals and delta is not None else None,
        "histogram": {"edges": S_EDGES, "counts": counts},
    }


def s_values(audit: list[dict], direction: str | None = None) -> list[float]:
    out = []
    for rec in audit:
        if direction and f"{rec.get('source')}->{rec.get('receiver')}" != direction:
            continue
        out += [x["s"] for x in rec.get("responses") or [] if x.get("s") is not None]
    return out


def clip_stats(rows: list[dict], model: str) -> dict:
    kinds = ("own_low", "own_high", "peer_low", "peer_high")
    per_step = []
    for row in rows:
        e = {"step": row["step"], "peer_responses": _num(row.get(f"{model}/peer_responses"))}
        for kind in kinds:
            e[kind] = _num(row.get(f"{model}/clip_frac/{kind}"))
        per_step.append(e)
    peer_steps = [e for e in per_step if (e["peer_responses"] or 0) > 0]
    has_peer_key = any(e["peer_responses"] is not None for e in per_step)
    if not has_peer_key:  # no peer counts logged: trust the logged peer rates as they are
        peer_steps = [e for e in per_step if e["peer_low"] is not None or e["peer_high"] is not None]
    zero = [e for e in peer_steps if (e["peer_low"] or 0) == 0 and (e["peer_high"] or 0) == 0]
    return {
        "per_step": per_step,
        "own_low": _mean([e["own_low"] for e in per_step]),
        "own_high": _mean([e["own_high"] for e in per_step]),
        "peer_low": _mean([e["peer_low"] for e in peer_steps]),
        "peer_high": _mean([e["peer_high"] for e in peer_steps]),
        "steps_with_peer": len(peer_steps),
        "peer_zero_clip_step_frac": len(zero) / len(peer_steps) if peer_steps else None,
    }


def reward_curve(rows: list[dict], model: str) -> dict:
    pts = [(row["step"], _num(row.get(f"{model}/reward/mean"))) for row in rows]
    pts = [(s, v) for s, v in pts if v is not None]
    af = [(row["step"], _num(row.get(f"{model}/all_fail_frac"))) for row in rows]
    vals = [v for _, v in pts]
    return {
        "steps": [s for s, _ in pts],
        "reward": vals,
        "all_fail_frac": {"steps": [s for s, v in af if v is not None], "values": [v for _, v in af if v is not None]},
        "first": vals[0] if vals else None,
        "last": vals[-1] if vals else None,
        "final": _mean(vals[-FINAL_WINDOW:]) if vals else None,
        "mean": _mean(vals),
    }


def eval_curves(rows: list[dict], extra_history: Sequence[dict] = ()) -> dict:
    """``eval/M/DATASET/pass@1`` series with the best step per key (best_checkpoint rule)."""
    hist: dict[int, dict] = {}
    for row in list(extra_history) + list(rows):
        ev = {k: v for k, v in row.items() if k.startswith("eval/")}
        if ev and "step" in row:
            hist.setdefault(int(row["step"]), {"step": int(row["step"])}).update(ev)
    history = [hist[s] for s in sorted(hist)]
    keys = sorted({k for h in history for k in h if k != "step" and re.match(r"^eval/.+/pass@\d+$", k)})
    out = {}
    for key in keys:
        pts = [(h["step"], _num(h.get(key))) for h in history if _num(h.get(key)) is not None]
        best = best_checkpoint(history, key)
        out[key] = {
            "steps": [s for s, _ in pts],
            "values": [v for _, v in pts],
            "best_step": best,
            "best": next((v for s, v in pts if s == best), None),
            "last": pts[-1][1] if pts else None,
        }
    return out


def step_ranges(steps: Iterable[int], parts: int = 3) -> list[tuple[int, int]]:
    """The logged steps cut into ``parts`` consecutive ranges of (nearly) equal length: [(first, last), ...]
    (fewer when there are fewer steps). 8 steps in thirds -> [(1, 3), (4, 5), (6, 8)]."""
    ordered = sorted(steps)
    n = len(ordered)
    cuts = [round(i * n / parts) for i in range(parts + 1)]
    return [(ordered[a], ordered[b - 1]) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]  # each cut and the next


def reward_monitor(
    rows: list[dict], model: str, families_chance: dict[str, float] | None = None, flags: Sequence[str] = FLAGS
) -> dict:
    """What the rewarded answers of ``model`` looked like, per third of training (see
    :mod:`graft.reward.shortcuts`): the share of rewarded responses with each flag (pooled, weighted by
    each step's ``rewarded/n``), the distinct-response share, and the mean reward of every problem family
    beside its chance level (``families_chance``: the reward of boxing a number of the question)."""

    logged = [r for r in rows if _num(r.get(f"{model}/rewarded/n")) is not None]
    out: dict[str, Any] = {"ranges": []}
    for lo, hi in step_ranges([r["step"] for r in logged]):
        part = [r for r in logged if lo <= r["step"] <= hi]
        n = sum(x for r in part if (x := _num(r[f"{model}/rewarded/n"])) is not None)  # all of them (``logged``)
        entry = {
            "steps": [lo, hi],
            "rewarded": int(n),
            "distinct_frac": _mean([_num(r.get(f"{model}/distinct_frac")) for r in part]),
        }
        for f in flags:
            pairs = [(_num(r[f"{model}/rewarded/n"]), _num(r.get(f"{model}/rewarded/{f}"))) for r in part]
            entry[f] = sum(k * v for k, v in pairs if k and v is not None) / n if n else None
        fam_keys = sorted({k for r in part for k in r if k.startswith(f"{model}/reward/family/")})
        entry["families"] = {k.rsplit("/", 1)[1]: _mean([_num(r.get(k)) for r in part]) for k in fam_keys}
        out["ranges"].append(entry)
    if families_chance:
        out["chance"] = families_chance
    return out


def families_chance(cfg: dict) -> dict[str, float]:
    """Chance level of every family of a run's procedural task (its config dict): the mean over 400 draws
    of the family's generator (repeats allowed: ``square`` has only 2 x max_operand + 1 problems); empty for a task
    that cannot draw (:meth:`graft.data.tasks.Task.draw`) and for data files."""
    data = cfg.get("data") or {}
    train = data.get("train")
    if not isinstance(train, str) or train not in TASKS or TASKS[train].settings is None:
        return {}
    task = TASKS[train]
    try:
        settings = build(task.settings, data.get(train) or {}, f"data.{train}")
    except ConfigError:
        return {}
    out = {}
    for fam in task.families(settings):
        rng = random.Random(0)
        draws = [task.draw(settings, fam, rng) for _ in range(400)]
        if any(d is None for d in draws):
            return {}
        out[fam] = sum(chance_level(q, a) for q, a in draws if q) / len(draws)
    return out


def compute_curve(rows: list[dict], models: list[str]) -> dict:
    """Cumulative wall-clock (time/step_s) and generated tokens (sum over models of M/tokens/generated)."""
    wall, tok, steps = [], [], []
    w = t = 0.0
    for row in rows:
        w += _num(row.get("time/step_s")) or 0.0
        t += sum(_num(row.get(f"{m}/tokens/generated")) or 0.0 for m in models)
        steps.append(row["step"])
        wall.append(w)
        tok.append(t)
    per_model: dict[str, list[float]] = {m: [] for m in models}
    for m in models:
        acc = 0.0
        for row in rows:
            acc += _num(row.get(f"{m}/tokens/generated")) or 0.0
            per_model[m].append(acc)
    return {"steps": steps, "wall_s": wall, "tokens": tok, "tokens_by_model": per_model}


# ----------------------------------------------------------------------------- analysis


def _summary_eval_history(run_dir: Path) -> list:
    """The ``eval_history`` of the run's ``summary.json`` (none when it is missing or unreadable)."""
    try:
        return json.loads((run_dir / "summary.json").read_text()).get("eval_history") or []
    except (OSError, json.JSONDecodeError, AttributeError):
        return []


def compute_analysis(run_dir: str | Path, against: str | Path | None = None) -> dict:
    """The analysis dict of ``run_dir`` without writing anything (see module doc).

    ``against``: a second run folder (e.g. an independent GRPO run of another model on the same
    prompts and seed); complementarity is then also computed between this run's models and the
    other run's, matching (step, prompt_id) in the two stores.
    """
    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").exists():
        raise AnalysisError(f"{run_dir}: no metrics.jsonl (not a graft run folder?)")
    cfg = read_config(run_dir)
    rows = read_metrics(run_dir)
    audit = read_jsonl(run_dir / "audit.jsonl")
    models = model_names(cfg, rows)
    dirs = directions(models, rows, audit)
    desc = _exchange(run_dir)
    # the gate in force: the kind's effective delta (HACPO's sharing uses 0); the configured one of a config that
    # no longer loads; None for a run that gates nothing (GRPO) or has no config
    delta = desc.settings.get("exchange.delta") if desc else (cfg.get("exchange") or {}).get("delta")
    threshold = success_threshold_of(cfg)
    counts = read_store_counts(run_dir, threshold)
    chance = families_chance(cfg)
    flags = config_domain(cfg).flags
    comp = {}
    store_models = {k[0] for k in counts} if counts is not None else set()
    for d in dirs:
        if counts is not None and set(d.split("->")) <= store_models:
            comp[d] = {"source": "store", **complementarity_from_counts(counts, d)}
        else:
            comp[d] = {"source": "metrics", **complementarity_from_metrics(rows, d)}
    if against is not None:
        comp.update(_cross_run_complementarity(run_dir, Path(against), counts))
    analysis: dict[str, Any] = {
        "run_dir": str(run_dir),
        "mode": desc.method.lower() if desc else ("graft" if audit else "grpo"),
        "exchange_kind": desc.kind if desc else None,
        "exchange_description": desc.lines() if desc else None,
        "models": models,
        "directions": dirs,
        "delta": delta,
        "success_threshold": threshold,
        "steps": len(rows),
        "last_step": rows[-1]["step"] if rows else None,
        "complementarity": comp,
        "exchange": {d: exchange_stats(rows, audit, d) for d in dirs if _has_exchange(rows, audit, d)},
        "treatment": _treatments(rows, audit, dirs, threshold),
        "s": {d: s_distribution(s_values(audit, d), delta) for d in dirs if s_values(audit, d)},
        "s_metrics": {d: _s_metric_series(rows, d) for d in dirs if any(f"exchange/{d}/s_p50" in r for r in rows)},
        "clip": {m: clip_stats(rows, m) for m in models},
        "rewards": {m: reward_curve(rows, m) for m in models},
        "reward_monitor": {
            m: reward_monitor(rows, m, chance, flags) for m in models if any(f"{m}/rewarded/n" in r for r in rows)
        },
        "eval": eval_curves(rows, _summary_eval_history(run_dir)),
        "compute": compute_curve(rows, models),
    }
    all_s = s_values(audit)
    if all_s:
        analysis["s"]["all"] = s_distribution(all_s, delta)
    return analysis


def _treatments(rows: list[dict], audit: list[dict], dirs: list[str], threshold: float) -> dict[str, dict]:
    """:func:`treatment` of every direction the audit log has records of."""
    audited = {f"{r.get('source')}->{r.get('receiver')}" for r in audit}
    return {d: treatment(rows, audit, d, threshold) for d in dirs if d in audited}


def _median(xs: Sequence[float]) -> float | None:
    return quantile(sorted(xs), 0.5) if xs else None


def treatment(rows: list[dict], audit: list[dict], direction: str, threshold: float) -> dict:
    """Did the exchange happen, and what limited it, from the audit log and metrics of one direction.

    Balancing: steps where this direction had candidates but the balanced m was 0 (the other direction had
    none). Gate: transferred vs admitted responses, correct (graded by the source: a reward above ``threshold``, the
    run's ``reward.success_threshold``) and not. Drift: the median
    ``s`` and the mean log-probs of the responses transferred in the first and in the last third of training
    (thirds of the logged steps; a third without transfers has none). Dose: the mean share of peer rows in the
    receiver's update rows (steps with peer rows and all steps). Hand-worked case in tests/evaluation/test_treatment.py.
    """
    src, recv = direction.split("->")
    recs = sorted((r for r in audit if r.get("source") == src and r.get("receiver") == recv), key=lambda r: r["step"])
    resp = [(r["step"], x) for r in recs for x in r.get("responses") or []]
    correct = [x for _, x in resp if succeeded(x.get("reward_source") or 0, threshold)]
    wrong = [x for _, x in resp if not succeeded(x.get("reward_source") or 0, threshold)]
    steps_t = sorted({st for st, _ in resp})
    thirds = step_ranges({r["step"] for r in rows} | {r["step"] for r in recs})

    def drift(lo: int, hi: int) -> dict:
        xs = [x for st, x in resp if lo <= st <= hi]
        return {
            "steps": [lo, hi],
            "s_median": _median([x["s"] for x in xs if x.get("s") is not None]),
            "mean_logp_receiver": _mean([x.get("mean_logp_receiver") for x in xs]),
            "mean_logp_source": _mean([x.get("mean_logp_source") for x in xs]),
        }

    first, last = (drift(*thirds[0]), drift(*thirds[-1])) if steps_t else (None, None)
    share = [x for r in rows if (x := r.get(f"{recv}/peer_row_share")) is not None]
    return {
        "steps": len(recs),
        "steps_with_candidates": sum(1 for r in recs if r.get("candidates")),
        "steps_balanced_to_zero": sum(1 for r in recs if r.get("candidates") and not r.get("m")),
        "steps_with_transfer": len(steps_t),
        "transferred_correct": len(correct),
        "admitted_correct": sum(1 for x in correct if x.get("admitted")),
        "transferred_incorrect": len(wrong),
        "admitted_incorrect": sum(1 for x in wrong if x.get("admitted")),
        "first_third": first,
        "last_third": last,
        "s_median_ratio": (
            last["s_median"] / first["s_median"]
            if first and last and first["s_median"] and last["s_median"] is not None
            else None
        ),
        "peer_row_share_mean": _mean(share),
        "peer_row_share_mean_when_exchanging": _mean([x for x in share if x > 0]),
    }


def treatment_lines(tr: dict[str, dict]) -> list[str]:
    """The treatment section of ``graft analyze``."""
    lines = ["\ntreatment (did the exchange happen?):"]
    for d, t in tr.items():
        gate = f"{t['admitted_correct']}/{t['transferred_correct']}" if t["transferred_correct"] else "0/0"
        lines.append(
            f"  {d}: admitted {t['admitted_correct']} correct + {t['admitted_incorrect']} incorrect "
            f"(gate passed {gate} correct, {t['admitted_incorrect']}/{t['transferred_incorrect']} incorrect); "
            f"transfers in {t['steps_with_transfer']} of {t['steps']} steps, {t['steps_balanced_to_zero']} steps "
            f"with candidates balanced to m = 0; peer rows {_f(t['peer_row_share_mean'], '.2f', True)} of the "
            f"receiver's update rows ({_f(t['peer_row_share_mean_when_exchanging'], '.1f', True)} in steps with any)"
        )
        if t["first_third"]:
            f, la = t["first_third"], t["last_third"]
            lines.append(
                f"    median s {_f(f['s_median'], '.2f')} (steps {f['steps'][0]}-{f['steps'][1]}) -> "
                f"{_f(la['s_median'], '.2f')} (steps {la['steps'][0]}-{la['steps'][1]}), ratio "
                f"{_f(t['s_median_ratio'], '.2f')}; mean log-p receiver {_f(f['mean_logp_receiver'], '.2f')} -> "
                f"{_f(la['mean_logp_receiver'], '.2f')}, source {_f(f['mean_logp_source'], '.2f')} -> "
                f"{_f(la['mean_logp_source'], '.2f')}"
            )
    return lines


def _exchange(run_dir: Path) -> ExchangeDescription | None:
    """What the run's exchange did, with the settings it used (:func:`graft.exchange.kinds.describe_exchange` of
    its config.yaml), or None when its config.yaml is missing or no longer loads (a run of an older graft)."""
    try:
        return describe_exchange(load_config(run_dir / "config.yaml"))
    except (ConfigError, OSError):
        return None


def _has_exchange(rows, audit, d) -> bool:
    src, recv = d.split("->")
    return any(r.get("source") == src and r.get("receiver") == recv for r in audit) or any(
        k.startswith(f"exchange/{d}/") for row in rows for k in row
    )


def _s_metric_series(rows, d) -> dict:
    out: dict[str, list[Any]] = {"steps": []}
    for q in ("s_p10", "s_p50", "s_p90", "s_mean"):
        out[q] = []
    for row in rows:
        if f"exchange/{d}/s_p50" in row:
            out["steps"].append(row["step"])
            for q in ("s_p10", "s_p50", "s_p90", "s_mean"):
                out[q].append(_num(row.get(f"exchange/{d}/{q}")))
    return out


def _cross_run_complementarity(run_dir: Path, other: Path, counts) -> dict:
    other_counts = read_store_counts(other, run_success_threshold(other))
    if counts is None or other_counts is None:
        raise AnalysisError(f"--against needs trajectory stores in both {run_dir} and {other}")
    la, lb = run_dir.name or "run", other.name or "other"
    if la == lb:
        la, lb = f"{la}#1", f"{lb}#2"
    merged = {(f"{la}:{m}", s, p): v for (m, s, p), v in counts.items()}
    merged |= {(f"{lb}:{m}", s, p): v for (m, s, p), v in other_counts.items()}
    out = {}
    for ma in sorted({m for m, _, _ in counts}):
        for mb in sorted({m for m, _, _ in other_counts}):
            a, b = f"{la}:{ma}", f"{lb}:{mb}"
            out[f"{a}->{b}"] = {"source": "store", **complementarity_from_counts(merged, f"{a}->{b}")}
            out[f"{b}->{a}"] = {"source": "store", **complementarity_from_counts(merged, f"{b}->{a}")}
    return out


def analyze(run_dir: str | Path, against: str | Path | None = None) -> dict:
    """Compute the analysis of ``run_dir`` and write it to ``RUN_DIR/analysis.json``; returns it."""
    analysis = json_clean(compute_analysis(run_dir, against))
    (Path(run_dir) / "analysis.json").write_text(json.dumps(analysis, indent=1) + "\n")
    return analysis


# ----------------------------------------------------------------------------- summary


def _f(v, spec=".3f", pct=False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{100 * v:{spec}}%" if pct else f"{v:{spec}}"


def complementarity_matrix(a: dict) -> list[str]:
    """The N x N complementarity matrix of an analysis as markdown rows: row = source S, column =
    receiver R, cell = share of R's all-fail prompts on which S had a success (pooled over training)."""
    models, comp = a["models"], a["complementarity"]
    if len(models) < 2 or not comp:
        return []
    rows = ["| source \\ receiver | " + " | ".join(models) + " |", "|---|" + "---:|" * len(models)]
    for s in models:
        cells = ["—" if s == r else _f(comp.get(f"{s}->{r}", {}).get("overall"), ".1f", True) for r in models]
        rows.append(f"| {s} | " + " | ".join(cells) + " |")
    return rows


_MONITOR_KEYS = ("steps", "rewarded", "distinct_frac", "families")
"""The keys of a monitor range that are not flags."""


def monitor_lines(monitor: dict) -> list[str]:
    """The reward monitor as text: per model and third of training, the share of rewarded answers with
    each shortcut flag, then every family's reward per third beside its chance level."""

    if not monitor:
        return []
    first = next((e for mon in monitor.values() for e in mon["ranges"]), None)
    names = [k for k in first if k not in _MONITOR_KEYS] if first is not None else list(FLAGS)
    legend = (
        ("box an operator / a fraction / a number of the question, box twice, copy a worked example, echo the question")
        if tuple(names) == FLAGS
        else "carry each flag of the domain's monitor"
    )
    lines = [f"\nreward monitor: share of rewarded answers that {legend}; distinct responses per group:"]
    for m, mon in monitor.items():
        for e in mon["ranges"]:
            flags = " ".join(f"{f} {_f(e[f], '.0f', True)}" for f in names)
            lines.append(
                f"  {m} steps {e['steps'][0]}-{e['steps'][1]}: {e['rewarded']} rewarded; {flags}; "
                f"distinct {_f(e['distinct_frac'], '.0f', True)}"
            )
        fams = sorted({f for e in mon["ranges"] for f in e["families"]})
        if fams:
            chance = mon.get("chance", {})
            lines.append(f"  {m} reward by family, per third (chance level):")
            for f in fams:
                thirds = " -> ".join(_f(e["families"].get(f), ".0f", True) for e in mon["ranges"])
                lines.append(f"    {f}: {thirds}  ({_f(chance.get(f), '.0f', True)})")
    return lines


def summary_text(a: dict) -> str:
    """Readable multi-line summary of an analysis dict."""
    lines = [
        f"run {a['run_dir']}: mode {a['mode']}, models {', '.join(a['models']) or '-'}, "
        f"{a['steps']} steps logged (last {a['last_step']})"
    ]
    lines += a.get("exchange_description") or []
    lines.append(f"\nrewards (step 1 -> last step, and the mean of the last {FINAL_WINDOW} steps):")
    for m, r in a["rewards"].items():
        lines.append(f"  {m}: {_f(r['first'])} -> {_f(r['last'])}  (last {FINAL_WINDOW}: {_f(r['final'])})")
    lines += monitor_lines(a.get("reward_monitor") or {})
    if a["eval"]:
        lines.append("\nevaluation (best step by the best-checkpoint rule):")
        for k, e in a["eval"].items():
            lines.append(f"  {k}: last {_f(e['last'], '.2f', True)}, best {_f(e['best'], '.2f', True)} at step {e['best_step']}")
    if len(a["models"]) > 2 and a["complementarity"]:
        lines.append("\ncomplementarity matrix (row: source, column: receiver):")
        lines += ["  " + r for r in complementarity_matrix(a)]
    if a["complementarity"]:
        lines.append("\ncomplementarity (share of the receiver's all-fail prompts the source solved):")
        for d, c in a["complementarity"].items():
            extra = f" = {c['solved']}/{c['receiver_all_fail']} prompt-steps" if c["source"] == "store" else ""
            lines.append(
                f"  {d}: overall {_f(c['overall'], '.1f', True)}{extra}, mean of steps "
                f"{_f(c['mean_of_steps'], '.1f', True)} [{c['source']}]"
            )
    if a["exchange"]:
        lines.append("\nexchange (per step means; totals):")
        for d, e in a["exchange"].items():
            t = e["totals"]
            lines.append(
                f"  {d}: candidates {_f(t['mean_candidates'], '.1f')} -> kept {_f(t['mean_kept'], '.1f')} per step; "
                f"transferred {t['transferred']}, admitted {t['admitted']} ({_f(t['admitted_frac'], '.1f', True)})"
            )
    if a.get("treatment"):
        lines += treatment_lines(a["treatment"])
    if a["s"]:
        lines.append(f"\ncompatibility s (gate delta = {a['delta']}):")
        for d, s in a["s"].items():
            q = s["quantiles"]
            lines.append(
                f"  {d}: n={s['count']} p10 {_f(q['p10'])} p50 {_f(q['p50'])} p90 {_f(q['p90'])} "
                f"mean {_f(s['mean'])}, above delta {_f(s['above_delta_frac'], '.1f', True)}"
            )
    lines.append("\nclip rates (mean over steps; peer over steps with peer data):")
    for m, c in a["clip"].items():
        lines.append(
            f"  {m}: own low {_f(c['own_low'], '.3f', True)} high {_f(c['own_high'], '.3f', True)} | "
            f"peer low {_f(c['peer_low'], '.3f', True)} high {_f(c['peer_high'], '.3f', True)} "
            f"({c['steps_with_peer']} steps, {_f(c['peer_zero_clip_step_frac'], '.1f', True)} with no peer clip)"
        )
    comp = a["compute"]
    if comp["steps"]:
        lines.append(f"\ncompute: {comp['wall_s'][-1]:.0f} s wall-clock, {comp['tokens'][-1]:.0f} tokens generated")
    return "\n".join(lines)
