"""``graft experiment summarize``'s numbers: ``results/summary.json`` of a plan, from the small files each run left
under ``results/`` (pass@1 per arm, the strict re-grade, the exchange, the paired comparisons and their verdicts)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from graft.commands.experiment.plan import STORED_PREFIX, Comparison, Member, Plan, base_member, check_unchanged
from graft.config import EvalConfig, run_success_threshold
from graft.data.tasks import family_of
from graft.domains.base import run_domain
from graft.domains.math import WORKED_EQUATIONS
from graft.evaluation.analyze import read_jsonl, treatment
from graft.evaluation.metrics import paired_interval, paired_verdict, unpaired_interval
from graft.registry import FAMILIES
from graft.reward.shortcuts import chance_level, shortcut_shares
from graft.reward.verifier import extract_boxed, is_number, verify_number
from graft.success import succeeded


def _pass1(m: Member, model: str, dataset: str | None = None) -> float | None:
    path = m.results_dir / "eval" / model / "results.json"
    if not path.is_file():
        return None
    res = json.loads(path.read_text())
    if dataset is None:
        return res["macro"]["pass@1"]["mean"]
    d = res["datasets"].get(dataset)
    return d["pass@1"]["mean"] if d else None


CHANCE_FAMILY = 0.25
"""A problem family whose chance level (the reward of boxing a number of the question,
:func:`graft.reward.shortcuts.chance_level`) is at least this is left out of the skill-only pass@1 (``max``: 0.5)."""


def eval_family(prompt_id: str) -> str:
    """The problem family of an eval prompt id (``test_hard-max-00003`` -> ``max``; ``max-00003`` -> ``max``)."""
    name = family_of(prompt_id)
    return name.split("-", 1)[1] if "-" in name and name.split("-", 1)[1] in FAMILIES else name


def regraded_pass1(m: Member, model: str, problems: dict[str, str] | None = None) -> dict | None:
    """A finished run's stored eval responses re-graded with the strict rule (``reward.answer_form=number``:
    one final answer, the reference written in lowest terms; :func:`graft.reward.verifier.verify_number`):

    - ``pass@1``: macro over the eval data sets; ``pass@1_skill``: the same without the families whose
      chance level is at least :data:`CHANCE_FAMILY` (``max``), where an answer can be read off the question;
    - ``expression_share_of_correct`` / ``expression_share_of_boxed``: responses whose box held an
      expression, among those the run's own grading counted correct / among all with a non-empty box;
    - ``monitor``: :func:`graft.reward.shortcuts.shortcut_shares` of the responses the run's own grading
      rewarded (``as_run``) and of those the strict rule rewards (``strict``);
    - ``families``: per problem family, strict pass@1 and chance level.

    ``problems``: prompt id -> problem text, for eval files that do not record it (:func:`eval_problems`).
    ``None`` when the responses were not kept, or when the run's domain is not a boxed-answer one (``code``, a
    user's: the strict rule means nothing there; its monitor is in each run's ``analyze.txt``)."""
    if _run_domain(m) not in ("math", "number"):
        return None
    tally = _Regrade(run_success_threshold(m.results_dir))
    for path in sorted((m.results_dir / "eval" / model).glob("*/repeat_*.jsonl")):
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        per_prompt = [tally.add_row(r, problems) for r in rows]
        if per_prompt:
            tally.per_set.append(sum(per_prompt) / len(per_prompt))
        skill = [
            p for r, p in zip(rows, per_prompt, strict=True) if _below_chance_cut(tally.fams[eval_family(r["id"])]["chance"])
        ]
        if skill:
            tally.per_set_skill.append(sum(skill) / len(skill))
    return tally.summary() if tally.per_set else None


@dataclass
class _Regrade:
    """What :func:`regraded_pass1` gathers over a run's eval files."""

    threshold: float
    """The run's ``reward.success_threshold``: what its own grading counted correct, and the monitor's rewarded."""

    per_set: list[float] = field(default_factory=list)
    """Strict pass@1 of each eval file (data set and repeat)."""
    per_set_skill: list[float] = field(default_factory=list)
    """The same over the prompts of the families under the chance cut (files that have some)."""
    fams: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    """Problem family -> its prompts' strict pass@1 and chance levels."""
    texts: list[str] = field(default_factory=list)
    questions: list[str] = field(default_factory=list)
    as_run: list[float] = field(default_factory=list)
    strict: list[float] = field(default_factory=list)
    """Every response, its question, the run's own reward and the strict one (the monitor's input)."""
    boxed: int = 0
    expr_boxed: int = 0
    correct: int = 0
    expr_correct: int = 0
    """Responses with a non-empty box / an expression in it, among all and among those the run counted correct."""

    def add_row(self, r: dict, problems: dict[str, str] | None) -> float:
        """Re-grade one prompt's responses; returns its strict pass@1."""
        problem = r.get("problem") or (problems or {}).get(r["id"])
        strict = [verify_number(resp, r["answer"])[0] for resp in r["responses"]]
        pass1 = sum(strict) / len(strict)
        chance = chance_level(problem, r["answer"]) if problem else 0.0
        f = self.fams.setdefault(eval_family(r["id"]), {"pass@1": [], "chance": []})
        f["pass@1"].append(pass1)
        f["chance"].append(chance)
        self.texts += r["responses"]
        self.questions += [problem or ""] * len(r["responses"])
        self.as_run += r["rewards"]
        self.strict += strict
        for resp, old in zip(r["responses"], r["rewards"], strict=True):  # one reward per response
            content = extract_boxed(resp)
            expression = bool(content and not is_number(content))
            self.boxed += bool(content)
            self.expr_boxed += expression
            if succeeded(old, self.threshold):
                self.correct += 1
                self.expr_correct += expression
        return pass1

    def summary(self) -> dict:
        """:func:`regraded_pass1`'s result."""
        return {
            "pass@1": sum(self.per_set) / len(self.per_set),
            "pass@1_skill": sum(self.per_set_skill) / len(self.per_set_skill) if self.per_set_skill else None,
            "expression_share_of_correct": self.expr_correct / self.correct if self.correct else None,
            "expression_share_of_boxed": self.expr_boxed / self.boxed if self.boxed else None,
            "monitor": {
                "as_run": shortcut_shares(self.texts, self.questions, self.as_run, WORKED_EQUATIONS, threshold=self.threshold),
                "strict": shortcut_shares(self.texts, self.questions, self.strict, WORKED_EQUATIONS, threshold=self.threshold),
            },
            "families": {
                f: {"pass@1": _mean(v["pass@1"]), "chance": _mean(v["chance"]), "prompts": len(v["pass@1"])}
                for f, v in sorted(self.fams.items())
            },
        }


def _run_domain(m: Member) -> str:
    """The ``reward.domain`` a recorded run trained with (``math`` when its config is not recorded)."""
    return run_domain(m.results_dir).name


def eval_problems(plan: Plan) -> dict[str, str]:
    """Prompt id -> problem text of every eval data set of a plan."""
    out = {}
    for spec in plan.eval.get("data", {}).values():
        path = Path(spec)
        if path.is_file():
            for line in path.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    out[str(row["id"])] = row["problem"]
    return out


def _metrics(m: Member) -> list[dict]:
    p = m.results_dir / "metrics.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.is_file() else []


def _exchange_total(m: Member, direction: str, key: str = "admitted") -> int | None:
    """Sum of ``exchange/{direction}/{key}`` over a finished run's steps; None for a run not finished yet."""
    rows = _metrics(m)
    return int(sum(r.get(f"exchange/{direction}/{key}") or 0 for r in rows)) if rows else None


def _treatment(m: Member, direction: str) -> dict | None:
    """:func:`graft.evaluation.analyze.treatment` of a finished run's direction (metrics and audit log), the one
    definition of its counts and drift; None for a run not finished yet."""
    rows = _metrics(m)
    audit = read_jsonl(m.results_dir / "audit.jsonl")
    return treatment(rows, audit, direction, run_success_threshold(m.results_dir)) if rows else None


def _exchange_steps(m: Member, direction: str, t: dict | None) -> dict | None:
    """Per finished run and direction (``t``: its :func:`_treatment`): steps with a balanced target m > 0, steps
    with an admitted response, and the median s of the responses transferred in the first and in the last third
    of training."""
    if t is None:
        return None
    rows, pre, first, last = _metrics(m), f"exchange/{direction}", t["first_third"], t["last_third"]
    return {
        "steps": len(rows),
        "with_target": sum((r.get(f"{pre}/m") or 0) > 0 for r in rows),
        "with_admitted": sum((r.get(f"{pre}/admitted") or 0) > 0 for r in rows),
        "s_median_first_third": first and first["s_median"],
        "s_median_last_third": last and last["s_median"],
    }


def _admitted_correct(m: Member, t: dict | None) -> int | None:
    """Peer responses admitted over the run that the source graded correct (``t``: the direction's
    :func:`_treatment`); None without an audit log."""
    return t["admitted_correct"] if t is not None and (m.results_dir / "audit.jsonl").is_file() else None


def _peer_row_share(m: Member, model: str) -> float | None:
    """Mean over steps of the peer rows' share of ``model``'s update rows (``M/peer_row_share``)."""
    vals = [r[f"{model}/peer_row_share"] for r in _metrics(m) if r.get(f"{model}/peer_row_share") is not None]
    return _mean(vals) if vals else None


def _mean(xs: Sequence[float | None]) -> float | None:
    """Mean of the values that are neither None nor NaN; None when there are none."""
    kept = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(kept) / len(kept) if kept else None


def _below_chance_cut(chances: list[float]) -> bool:
    """Whether a problem family's mean chance level is under :data:`CHANCE_FAMILY` (:func:`regraded_pass1`)."""
    mean = _mean(chances)
    assert mean is not None, "each prompt of a family adds its (finite) chance level before the family is read"
    return mean < CHANCE_FAMILY


def _std(xs: Sequence[float | None]) -> float | None:
    kept = [x for x in xs if x is not None]
    if len(kept) < 2:
        return None
    mu = sum(kept) / len(kept)
    return math.sqrt(sum((x - mu) ** 2 for x in kept) / (len(kept) - 1))


def _clip_peer(m: Member, model_keys: list[str]) -> float | None:
    """Peer-token clip rate (low + high) over the run: the mean of the per-step fractions of the models in
    ``model_keys`` over the (step, model) pairs that trained on peer data; None when there are none."""
    vals = []
    for r in _metrics(m):
        for name in model_keys:
            lo, hi = r.get(f"{name}/clip_frac/peer_low"), r.get(f"{name}/clip_frac/peer_high")
            if (r.get(f"{name}/peer_responses") or 0) > 0 and lo is not None:
                vals.append(lo + (hi or 0.0))
    return _mean(vals)


def summarize(plan: Plan) -> dict:
    """``results/summary.json`` (the shape the mini reproduction promises, plus details). Refused when a run differs
    from what the plan resolves to now (:func:`check_unchanged`): runs of different configs are never pooled."""
    check_unchanged(plan)
    arms = {arm: members for arm, members in plan.arms().items() if members[0].store is None}
    problems = eval_problems(plan)
    out = _summary_skeleton(plan)
    for arm, members in arms.items():
        _add_arm(out, plan, arm, members, problems)
    for key, arm in plan.clip_frac_peer.items():
        if arm in arms:
            first = min(arms[arm], key=lambda m: m.seed)
            out["clip_frac_peer"][key] = _clip_peer(first, plan.models)
            out["clip_frac_peer_by_model"][key] = {a: _clip_peer(first, [a]) for a in plan.models}
    _add_stored(out, plan, arms, problems)
    if plan.base:
        bm = base_member(plan)
        out["base"] = {a: _pass1(bm, a) for a in plan.models}
        out["base_strict"] = {a: (regraded_pass1(bm, a, problems) or {}).get("pass@1") for a in plan.models}
    if plan.onestep is not None and plan.onestep.is_file():
        out.update(one_step_effect(json.loads(plan.onestep.read_text())))
    for c in plan.comparisons:
        if c.arm in arms and c.baseline in arms:
            out[f"paired_diff_{c.name}"] = _paired_diff(arms, c, out["arms"], plan.models)
            out[f"paired_diff_{c.name}_number"] = _paired_diff(arms, c, out["arms_answer_form_number"], plan.models)
            for suffix, table in (("", out["arms"]), ("_number", out["arms_answer_form_number"])):
                out[f"paired_ci_{c.name}{suffix}"] = {
                    a: paired_interval(ds) for a, ds in out[f"paired_diff_{c.name}{suffix}"].items()
                }
                out[f"unpaired_{c.name}{suffix}"] = {
                    a: unpaired_interval(table[c.arm][a], table[c.baseline][a]) for a in plan.models
                }
        if c.decision is not None:
            model, pairs = c.decision
            diffs = out.get(f"paired_diff_{c.name}", {}).get(model, [])
            out[f"decision_{c.name}"] = {"model": model, **paired_verdict(diffs, pairs)}
    return out


def one_step_effect(onestep: dict) -> dict:
    """A ``graft onestep`` summary in the plan summary's terms: ``one_step_effect`` (GRAFT's update minus
    GRPO's, per direction and prompt kind: mean difference in success rate, 95 % interval, prompts),
    ``one_step_effect_gate_off`` (the same with ``exchange.admission=all``) and ``one_step_treatment``
    (states, selected prompts, admitted and admitted-correct peer responses per direction), ``one_step_states``
    (training states measured, and those with a prompt to exchange: elsewhere GRAFT's update is GRPO's)."""

    def cut(table: dict) -> dict:
        keys = ("mean", "ci95", "prompts", "states", "differed", "t95")  # the last two from arms version 2 on
        return {d: {kind: {k: s[k] for k in keys if k in s} for kind, s in kinds.items()} for d, kinds in table.items()}

    return {
        "one_step_effect": cut(onestep["graft_minus_grpo"]),
        "one_step_effect_gate_off": cut(onestep["all_minus_grpo"]),
        "one_step_treatment": onestep["treatment"],
        "one_step_states": onestep.get("states"),
        "one_step_command": onestep.get("command"),
        **({"one_step_verdict_interval": onestep["verdict_interval"]} if "verdict_interval" in onestep else {}),
    }


def _summary_skeleton(plan: Plan) -> dict[str, Any]:
    """The summary's header and its per-arm tables, empty."""
    tables = (
        "arms",
        "by_dataset",
        "exchanged",
        "transferred",
        "exchange_steps",
        "clip_frac_peer",
        "clip_frac_peer_by_model",
        "stored",
        "arms_answer_form_number",
        "expression_share_of_correct",
        "expression_share_of_boxed",
        "stored_answer_form_number",
        "arms_strict_skill",
        "monitor",
        "families",
        "admitted_correct",
        "peer_row_share",
        "train_reward",
        "last_quarter",
    )
    ev = {
        "data": {k: Path(v).name for k, v in plan.eval["data"].items()},
        "n": plan.eval.get("n", EvalConfig.n),
        "temperature": plan.eval.get("temperature", EvalConfig.temperature),
        "top_p": plan.eval.get("top_p", EvalConfig.top_p),
        "repeats": plan.eval.get("repeats", EvalConfig.repeats),
        "metric": "pass@1, macro average over the eval data sets",
        "answer_form": plan.answer_form,
    }
    return {"models": plan.models, "seeds": sorted({m.seed for m in plan.members}), "eval": ev, **{key: {} for key in tables}}


REGRADED = (
    ("arms_answer_form_number", "pass@1"),
    ("arms_strict_skill", "pass@1_skill"),
    ("monitor", "monitor"),
    ("families", "families"),
    ("expression_share_of_correct", "expression_share_of_correct"),
    ("expression_share_of_boxed", "expression_share_of_boxed"),
)
"""Summary table -> the :func:`regraded_pass1` field it holds per arm, model and seed."""


def _add_arm(out: dict, plan: Plan, arm: str, members: list[Member], problems: dict[str, str]) -> None:
    """One arm's row of every per-arm table; the exchange tables for an arm that exchanges."""
    A = plan.models
    out["arms"][arm] = {a: [_pass1(m, a) for m in members] for a in A}
    regraded = {a: [regraded_pass1(m, a, problems) for m in members] for a in A}
    for table, key in REGRADED:
        out[table][arm] = {a: [r and r[key] for r in rs] for a, rs in regraded.items()}
    out["by_dataset"][arm] = {a: {d: [_pass1(m, a, d) for m in members] for d in plan.eval["data"]} for a in A}
    out["train_reward"][arm] = {a: [_last_reward(m, a) for m in members] for a in A}
    out["last_quarter"][arm] = {a: [last_quarter(_metrics(m), a) for m in members] for a in A}
    dirs = [f"{s}->{r}" for s in A for r in A if s != r]
    if any(m.exchanges for m in members) or any(_exchange_total(m, d) for m in members for d in dirs):
        out["exchanged"][arm] = {d: [_exchange_total(m, d) for m in members] for d in dirs}
        out["transferred"][arm] = {d: [_exchange_total(m, d, "transferred") for m in members] for d in dirs}
        treated = {d: [(m, _treatment(m, d)) for m in members] for d in dirs}
        out["exchange_steps"][arm] = {d: [_exchange_steps(m, d, t) for m, t in mt] for d, mt in treated.items()}
        out["admitted_correct"][arm] = {d: [_admitted_correct(m, t) for m, t in mt] for d, mt in treated.items()}
        out["peer_row_share"][arm] = {a: [_peer_row_share(m, a) for m in members] for a in A}


def _add_stored(out: dict, plan: Plan, arms: dict[str, list[Member]], problems: dict[str, str]) -> None:
    """The stored-peer runs' pass@1 per receiving model and, for each comparison whose baseline is the arm
    their groups came from, their gain beside the compared arm's (``stored_vs_online``)."""
    versus = [c for c in plan.comparisons if c.baseline == plan.stored_from and c.arm in arms and c.baseline in arms]
    stored = plan.arms()
    for a in plan.models:
        members = stored.get(f"{STORED_PREFIX}{a}", [])
        out["stored"][a] = [_pass1(m, a) for m in members]
        out["stored_answer_form_number"][a] = [(regraded_pass1(m, a, problems) or {}).get("pass@1") for m in members]
        if members and versus:
            out.setdefault("stored_vs_online", {})[a] = [_stored_row(m, a, c, arms) for c in versus for m in members]


def _stored_row(m: Member, model: str, c: Comparison, arms: dict[str, list[Member]]) -> dict:
    """A stored-peer run, the comparison's baseline and arm of the same seed: pass@1 of each, gains, ratio."""

    def at(arm: str) -> float | None:
        return next((_pass1(x, model) for x in arms[arm] if x.seed == m.seed), None)

    stored, baseline, online = _pass1(m, model), at(c.baseline), at(c.arm)
    return {"seed": m.seed, "stored": stored, c.baseline: baseline, c.arm: online, **stored_vs_online(stored, baseline, online)}


def _paired_diff(arms: dict[str, list[Member]], c: Comparison, table: dict, models: list[str]) -> dict:
    """Per model, ``table``'s value of the comparison's arm minus its baseline's, for each seed of the arm
    (None where the baseline has no such seed or either run is missing)."""
    out = {}
    for a in models:
        baseline = dict(zip((m.seed for m in arms[c.baseline]), table[c.baseline][a], strict=True))  # a value per run
        out[a] = [
            None if x is None or baseline.get(m.seed) is None else x - baseline[m.seed]
            for m, x in zip(arms[c.arm], table[c.arm][a], strict=True)
        ]
    return out


def stored_vs_online(stored: float | None, baseline: float | None, online: float | None) -> dict:
    """Gain of training on a stored peer log and of exchanging online, both over the baseline of the same
    seed, and their ratio (the paper's "84 % of the online gain"): defined only when the online gain is > 0."""
    if stored is None or baseline is None or online is None:
        return {"stored_gain": None, "online_gain": None, "ratio": None}
    s_gain, o_gain = stored - baseline, online - baseline
    return {"stored_gain": s_gain, "online_gain": o_gain, "ratio": s_gain / o_gain if o_gain > 0 else None}


def _last_reward(m: Member, model: str, k: int = 4) -> float | None:
    rewards = [r.get(f"{model}/reward/mean") for r in _metrics(m)]
    logged = [x for x in rewards if x is not None]
    return _mean(logged[-k:]) if logged else None


def last_quarter(rows: list[dict], model: str) -> dict | None:
    """What STUDY.md's selection rule reads, over the last quarter of a run's steps (the last ceil(S/4) of S
    logged steps; steps 19-24 of 24): mean strict training reward, mean ``distinct_frac`` and the share of
    rewarded responses the monitor flags ``echo`` or ``example_copy``. Hand-worked: rewards 0.1 0.2 0.3 0.5 over
    4 steps -> the last 1 step, 0.5."""
    rows = [r for r in rows if r.get(f"{model}/reward/mean") is not None]
    if not rows:
        return None
    tail = rows[len(rows) - math.ceil(len(rows) / 4) :]
    n = sum(r.get(f"{model}/rewarded/n") or 0 for r in tail)
    flagged = sum(
        ((r.get(f"{model}/rewarded/echo") or 0) + (r.get(f"{model}/rewarded/example_copy") or 0))
        * (r.get(f"{model}/rewarded/n") or 0)
        for r in tail
    )
    return {
        "steps": [tail[0].get("step"), tail[-1].get("step")],
        "reward": _mean([r[f"{model}/reward/mean"] for r in tail]),
        "distinct_frac": _mean([r.get(f"{model}/distinct_frac") for r in tail]),
        "echo_or_copy_share": flagged / n if n else None,
        "rewarded": n,
    }
