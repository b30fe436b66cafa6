"""A ``graft experiment`` plan: the YAML read and checked (:func:`load_plan`) into its runs (:class:`Member`), the
comparisons the report makes (:class:`Comparison`) and what it names (:class:`Plan`). The plan's format is in
:mod:`graft.commands.experiment`."""

from __future__ import annotations

import fnmatch
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from graft.config import ConfigError, config_diff, config_path, load_config, packaged_configs, to_dict
from graft.config.upgrade import ANSWER_FORMS as LEGACY_ANSWER_FORMS
from graft.exchange.kinds import hands_over

PLAN_KEYS = (
    "name",
    "config",
    "runs",
    "results",
    "overrides",
    "seeds",
    "arms",
    "stored",
    "eval",
    "order",
    "keep_checkpoints",
    "base",
    "title",
    "comparisons",
    "labels",
    "clip_frac_peer",
    "onestep",
)

STORED_PREFIX = "stored_"
"""Arm name prefix of the stored-peer runs (``stored_MODEL``): the plan's own arms may not use it."""


ANSWER_FORMS = {domain: form for form, domain in LEGACY_ANSWER_FORMS.items()}
"""``reward.domain`` -> the summary's ``answer_form`` (its name before domains, :data:`graft.config.ANSWER_FORMS`)."""


@dataclass
class Member:
    """One training run of the plan."""

    arm: str
    seed: int
    overrides: list[str]
    run_dir: Path
    results_dir: Path
    models: list[str] = field(default_factory=list)
    """Models this run trains (all of the base config's, or one for a stored-peer run)."""
    evaluated: bool = True
    """Its final checkpoint is evaluated (a plan with eval data); a pilot without eval data never
    touches evaluation prompts."""
    store: Path | None = None
    """A stored-peer run's source: the trajectory store of the run whose groups it trains on."""
    exchanges: bool = False
    """Its config hands groups between models (:func:`graft.exchange.kinds.hands_over`: every ``exchange.kind`` but
    ``none``)."""

    @property
    def eval_models(self) -> list[str]:
        return self.models if self.evaluated else []

    def train_overrides(self) -> list[str]:
        """The ``key=value`` overrides of this run's ``graft train`` on the plan's config."""
        return [*self.overrides, f"seed={self.seed}", f"run_dir={self.run_dir}"]

    def command(self, config: Path) -> list[str]:
        return [sys.executable, "-m", "graft.cli", "train", str(config), *self.train_overrides()]


@dataclass(frozen=True)
class Comparison:
    """A paired difference the report makes, seed by seed: ``arm`` minus ``baseline``."""

    name: str
    """Its summary.json keys: ``paired_diff_NAME`` (per seed) and ``paired_ci_NAME`` (their mean and Student-t
    95 % interval) and, strict re-grade, the same with ``_number``."""
    arm: str
    baseline: str
    decision: tuple[str, int] | None = None
    """A pre-registered verdict: (model, pairs) -- :func:`paired_verdict` on that model's differences (summary.json
    ``decision_NAME``)."""


@dataclass
class Plan:
    name: str
    config: Path
    runs: Path
    results: Path
    members: list[Member]
    eval: dict
    models: list[str]
    keep_checkpoints: bool | frozenset[str] = True
    """Keep every run's checkpoints (True), none once evaluated (False), or those of the named arms and
    ``ARM/SEED`` runs."""
    answer_form: str = "any"
    """The runs' ``reward.domain`` under its earlier name (``math`` is ``any``; stored-peer runs share it), or
    ``mixed`` when arms differ."""
    common: list[str] = field(default_factory=list)
    """The plan's overrides common to every run."""
    base: bool = False
    """Evaluate the starting weights too (``base: true``): summary.json's ``base``."""
    stored_from: str | None = None
    """The arm whose stored groups the stored-peer runs train on."""
    title: str | None = None
    """What REPORT.md's heading says the plan compares."""
    comparisons: list[Comparison] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    """An arm's name in the report's sentences (an arm without one: its own name)."""
    clip_frac_peer: dict[str, str] = field(default_factory=dict)
    """summary.json ``clip_frac_peer`` name -> the arm whose lowest seed's peer-token clip rate it reports."""
    onestep: Path | None = None
    """A ``graft onestep`` summary.json whose paired effects summary.json reports (``one_step_effect``)."""

    def arms(self) -> dict[str, list[Member]]:
        out: dict[str, list[Member]] = {}
        for m in self.members:
            out.setdefault(m.arm, []).append(m)
        return out

    def keeps_checkpoints(self, m: Member) -> bool:
        k = self.keep_checkpoints
        return k if isinstance(k, bool) else m.arm in k or f"{m.arm}/{m.seed}" in k

    def label(self, arm: str) -> str:
        return self.labels.get(arm, arm)


def load_plan(path: str | Path) -> Plan:
    """Read and check a plan; every member's config is validated before anything runs."""
    path = Path(path)
    raw = _read_plan(path)
    base = _base_config(path, str(raw.get("config", "")))
    common, seeds = list(raw.get("overrides", [])), list(raw.get("seeds", [0]))
    runs, results = Path(raw.get("runs", f"runs/{path.stem}")), Path(raw.get("results", f"results/{path.stem}"))
    cfg = load_config(base, common)
    models = [m.name for m in cfg.models]
    arm_names = _arm_names(path, raw.get("arms") or {})
    declared = _report_declarations(path, raw, arm_names, models)
    stored = _stored_spec(path, raw.get("stored"), arm_names)
    members = _arm_members(path, raw.get("arms") or {}, common, seeds, runs, results, models)
    if stored:
        members += _stored_members(path, stored, cfg, common, seeds, runs, results)
    _sort_members(path, members, [str(x) for x in raw.get("order") or []])
    forms = set()
    for m in members:
        if m.store is None:
            run_cfg = load_config(base, m.overrides + [f"seed={m.seed}"])
            forms.add(ANSWER_FORMS.get(run_cfg.reward.domain, run_cfg.reward.domain))
            m.exchanges = hands_over(run_cfg)
    ev = dict(raw.get("eval") or {})
    ev["data"] = {k: str((path.parent / v).resolve()) for k, v in (ev.get("data") or {}).items()}
    for m in members:
        m.evaluated = bool(ev["data"])
    return Plan(
        raw.get("name", path.stem),
        base,
        runs,
        results,
        members,
        ev,
        models,
        keep_checkpoints=_keep_checkpoints(path, raw.get("keep_checkpoints", True), members),
        answer_form=forms.pop() if len(forms) == 1 else "mixed",
        common=common,
        base=bool(raw.get("base", False)),
        stored_from=stored["from"] if stored else None,
        **declared,
    )


def _base_config(path: Path, name: str) -> Path:
    """The plan's ``config``: a file, relative to the plan's folder, or else a packaged preset's name
    (``baselines/dapo``: :func:`graft.config.config_path`)."""
    beside = (path.parent / name).resolve()
    packaged = name.removesuffix(".yaml").removesuffix(".yml")
    return config_path(packaged) if name and not beside.exists() and packaged in packaged_configs() else beside


def _keep_checkpoints(path: Path, spec: Any, members: list[Member]) -> bool | frozenset[str]:
    if isinstance(spec, bool):
        return spec
    if not isinstance(spec, list):
        raise ConfigError(f"{path}: keep_checkpoints: expected true, false or a list of ARM or ARM/SEED, got {spec!r}")
    known = {m.arm for m in members} | {f"{m.arm}/{m.seed}" for m in members}
    unknown = [str(x) for x in spec if str(x) not in known]
    if unknown:
        raise ConfigError(
            f"{path}: keep_checkpoints: the plan has no arm or run {unknown[0]!r} "
            f"(its arms: {sorted({m.arm for m in members})}; a run is ARM/SEED)"
        )
    return frozenset(map(str, spec))


def _read_plan(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"experiment plan not found: {path}")
    raw = yaml.safe_load(path.read_text()) or {}
    unknown = set(raw) - set(PLAN_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {sorted(unknown)}")
    return raw


def _arm_names(path: Path, arms: dict) -> list[str]:
    names = [str(a) for a in arms]
    for arm in names:
        if arm.startswith(STORED_PREFIX):
            raise ConfigError(f"{path}: arms.{arm}: names starting with {STORED_PREFIX!r} are the stored-peer runs'")
    return names


def _arm_members(
    path: Path, arms: dict, common: list[str], seeds: list[int], runs: Path, results: Path, models: list[str]
) -> list[Member]:
    """One member per arm and seed, in the order the plan lists them."""
    members = []
    for arm, spec in arms.items():
        arm = str(arm)
        overrides, arm_seeds = _arm(path, arm, spec, seeds)
        for s in arm_seeds:
            members.append(
                Member(arm, s, common + overrides, runs / arm / f"seed{s}", results / "runs" / arm / f"seed{s}", models)
            )
    return members


def _arm(path: Path, arm: str, spec: Any, seeds: list[int]) -> tuple[list[str], list[int]]:
    """An arm's overrides and seeds: ``[OVERRIDE, ...]`` or ``{overrides: [...], seeds: [...]}``."""
    if isinstance(spec, dict):
        unknown = set(spec) - {"overrides", "seeds"}
        if unknown:
            raise ConfigError(f"{path}: arms.{arm}: unknown key(s) {sorted(unknown)} (has overrides, seeds)")
        return list(spec.get("overrides", [])), list(spec.get("seeds", seeds))
    return list(spec or []), seeds


def _stored_spec(path: Path, spec: Any, arms: list[str]) -> dict | None:
    if not spec:
        return None
    if not isinstance(spec, dict) or set(spec) - {"from", "seeds"}:
        raise ConfigError(f"{path}: stored: expected {{from: ARM, seeds: [...]}}, got {spec!r}")
    return {**spec, "from": _arm_name(path, "stored.from", spec.get("from"), arms)}


def _stored_members(
    path: Path, stored: dict, cfg, common: list[str], seeds: list[int], runs: Path, results: Path
) -> list[Member]:
    """Per stored seed, each model of the pair trained alone on the other's groups stored by the ``from`` arm."""
    models = [m.name for m in cfg.models]
    if len(models) != 2:
        raise ConfigError(f"{path}: stored-peer arms need a pair of models, got {models}")
    members = []
    for s in stored.get("seeds", seeds[:1]):
        src = runs / stored["from"] / f"seed{s}" / "trajectories"
        for i, recv in enumerate(models):
            extra = [
                f"models=[{_model_yaml(cfg.models[i])}]",
                "exchange.kind=stored",
                f"peer.store_path={src}",
                f"peer.store_model={models[1 - i]}",
            ]
            arm = f"{STORED_PREFIX}{recv}"
            members.append(
                Member(arm, s, common + extra, runs / arm / f"seed{s}", results / "runs" / arm / f"seed{s}", [recv], store=src)
            )
    return members


def _sort_members(path: Path, members: list[Member], order: list[str]) -> None:
    """Put the runs ``order`` names first, in its order (``ARM/SEED``); the others keep theirs."""
    keys = [f"{m.arm}/{m.seed}" for m in members]
    unknown_runs = [o for o in order if o not in keys]
    if unknown_runs:
        raise ConfigError(f"{path}: order names runs that the plan does not have: {unknown_runs} (have {keys})")
    members.sort(key=lambda m: order.index(f"{m.arm}/{m.seed}") if f"{m.arm}/{m.seed}" in order else len(order))


def _report_declarations(path: Path, raw: dict, arms: list[str], models: list[str]) -> dict:
    """The plan's ``title``, ``comparisons``, ``labels``, ``clip_frac_peer`` and ``onestep``, every arm name checked."""
    title = raw.get("title")
    if title is not None and not isinstance(title, str):
        raise ConfigError(f"{path}: title: expected a string, got {title!r}")
    labels = _mapping(path, "labels", raw.get("labels"))
    for arm, text in labels.items():
        _arm_name(path, f"labels.{arm}", arm, arms)
        if not isinstance(text, str):
            raise ConfigError(f"{path}: labels.{arm}: expected a string, got {text!r}")
    clip = {
        str(k): _arm_name(path, f"clip_frac_peer.{k}", v, arms)
        for k, v in _mapping(path, "clip_frac_peer", raw.get("clip_frac_peer")).items()
    }
    comparisons = [
        _comparison(path, str(k), v, arms, models) for k, v in _mapping(path, "comparisons", raw.get("comparisons")).items()
    ]
    onestep = raw.get("onestep")
    if onestep is not None and not isinstance(onestep, str):
        raise ConfigError(f"{path}: onestep: expected the path of a `graft onestep` summary.json, got {onestep!r}")
    return {
        "title": title,
        "comparisons": comparisons,
        "labels": labels,
        "clip_frac_peer": clip,
        "onestep": None if onestep is None else (path.parent / onestep).resolve(),
    }


def _comparison(path: Path, name: str, spec: Any, arms: list[str], models: list[str]) -> Comparison:
    key = f"comparisons.{name}"
    if not isinstance(spec, dict) or not {"arm", "baseline"} <= set(spec) <= {"arm", "baseline", "decision"}:
        raise ConfigError(
            f"{path}: {key}: expected {{arm: ARM, baseline: ARM}} (and optionally decision: "
            f"{{model: MODEL, pairs: N}}), got {spec!r}"
        )
    c = Comparison(
        name,
        _arm_name(path, f"{key}.arm", spec["arm"], arms),
        _arm_name(path, f"{key}.baseline", spec["baseline"], arms),
        _decision(path, f"{key}.decision", spec.get("decision"), models),
    )
    if c.arm == c.baseline:
        raise ConfigError(f"{path}: {key}: compares arm {c.arm!r} with itself")
    return c


def _decision(path: Path, key: str, spec: Any, models: list[str]) -> tuple[str, int] | None:
    if spec is None:
        return None
    if not isinstance(spec, dict) or set(spec) != {"model", "pairs"}:
        raise ConfigError(f"{path}: {key}: expected {{model: MODEL, pairs: N}}, got {spec!r}")
    if spec["model"] not in models:
        raise ConfigError(f"{path}: {key}.model: the plan's runs have no model {spec['model']!r} (models: {models})")
    if isinstance(spec["pairs"], bool) or not isinstance(spec["pairs"], int) or spec["pairs"] < 2:
        raise ConfigError(f"{path}: {key}.pairs: expected an integer >= 2 (an interval needs two pairs), got {spec['pairs']!r}")
    return spec["model"], spec["pairs"]


def _mapping(path: Path, key: str, spec: Any) -> dict:
    if spec is None:
        return {}
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: {key}: expected a mapping, got {spec!r}")
    return spec


def _arm_name(path: Path, key: str, arm: Any, arms: list[str]) -> str:
    if arm not in arms:
        raise ConfigError(f"{path}: {key}: the plan has no arm {arm!r} (its arms: {arms})")
    return arm


def _model_yaml(m) -> str:
    """A model's config as a one-line YAML flow mapping (for a ``models=[...]`` override)."""
    return json.dumps(to_dict(m))


NOT_COMPARED = ("resume", "progress", "logging*")
"""Fields of a run's config that say how it was started and shown, not what it computes: the only ones in which a
run may differ from what its plan resolves to now (:func:`check_unchanged`)."""


def recorded_config(m: Member) -> Path | None:
    """The config a run of the plan was trained with: its run folder's ``config.yaml``, else the one recorded under
    ``results/`` (run elsewhere); None for a run not started."""
    return next((p for p in (m.run_dir / "config.yaml", m.results_dir / "config.yaml") if p.is_file()), None)


def check_unchanged(plan: Plan) -> None:
    """Every run of the plan that has started was trained with the config the plan resolves to now (fields of
    :data:`NOT_COMPARED` aside), or a one-line :class:`ConfigError` naming the arm, the field, both values and the
    run: a plan edited after runs finished would otherwise train its later seeds on another config and pool them
    with the earlier ones in one paired interval."""
    for m in plan.members:
        path = recorded_config(m)
        if path is None:
            continue
        try:
            then = to_dict(load_config(path))
        except ConfigError as e:
            raise ConfigError(f"{path} (the config of run {m.arm}/seed{m.seed}): {e}") from None
        now = to_dict(load_config(plan.config, m.train_overrides()))
        diff = [k for k in config_diff(then, now) if not any(fnmatch.fnmatchcase(k, p) for p in NOT_COMPARED)]
        if diff:
            k = diff[0]
            more = f" (and {', '.join(diff[1:])})" if len(diff) > 1 else ""
            raise ConfigError(
                f"arm {m.arm}: {k} is {_at(now, k)!r} in the plan now but {_at(then, k)!r} in its run seed{m.seed} "
                f"({path}){more}: the plan changed after that run started; restore it, or give the changed arm a "
                "new name so that its runs are kept apart"
            )


def _at(tree, key: str):
    for part in key.split("."):
        tree = tree[int(part)] if isinstance(tree, list) else (tree or {}).get(part)
    return tree


def plan_seeds(plan: Plan, arm: str) -> list[int]:
    return [m.seed for m in plan.members if m.arm == arm]


def plan_path_hint(plan: Plan) -> str:
    return f"configs/experiments/{plan.name}.yaml"


def base_member(plan: Plan) -> Member:
    """The plan's starting weights as a pseudo-run: evaluated once per model (``results/base/``), never trained."""
    return Member("base", 0, [], plan.runs / "base", plan.results / "base", list(plan.models), bool(plan.eval["data"]))
