"""``graft onestep``: does a peer group on an all-fail prompt teach the receiver that prompt, and does it transfer?

The most sensitive test of GRAFT this project can afford (issue 20 §4). Along a GRPO trajectory of the
configured pair (every model trained on its own groups, ``exchange.mode`` ignored), at chosen steps
the same weights, optimizer state and batch are updated three ways for each receiver R:

- ``grpo``: R's own groups (the update the trajectory then keeps);
- ``graft``: R's groups after GRAFT's exchange with the configured gate (δ, weights);
- ``all``: the same exchange with the gate off (``exchange.admission=all``): what δ protects against.

Every arm uses the same minibatch plan seed. R is then sampled ``--samples`` times on (i) the prompts
whose all-fail groups the exchange selected for replacement in direction S->R and (ii) ``--unseen``
unseen prompts of the same problem family per selected prompt (drawn from a pool disjoint from the
training prompts). Each prompt samples from the same seeds in every arm (common random numbers), so
the arms' success rates differ only where their weights do. The outcome is the paired difference in
success rate, ``graft - grpo`` and ``all - grpo``, per prompt; its 95 % interval is a bootstrap over
training states (seed, step) and prompts within them.

With ``--from RUN_DIR ...`` the states are those of finished GRPO runs instead (e.g. a study's GRPO arm):
step s starts from the run's checkpoint of step s - 1 (s = 1: the base weights), resumed exactly as
``resume=true`` would, so its batch and samples are the run's own step s and no trajectory is trained
again. The run must have saved and kept those checkpoints with their optimizer state
(``checkpoint.save_every``, ``keep_last``); its config and seed are read from its ``config.yaml``.

Outputs under ``--out``: ``rows.jsonl`` (one line per state, direction and prompt: success per arm,
kind, family, admitted and admitted-correct peer responses), ``seedS/metrics.jsonl`` (the GRPO
trajectory's rewards; not with ``--from``), ``summary.json`` and ``measured.json`` (the states
measured). A state already measured is skipped when the command is run again, so a stopped measurement
resumes state by state, and states of one trajectory may be measured by several commands into the same
``--out`` (e.g. step 1 before the run exists, later steps from its checkpoints). Local backend only.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import random
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from graft.config import ConfigError, load_config
from graft.data.arithmetic import FAMILIES, family_of
from graft.exchange.handover import Scoring
from graft.exchange.kinds import exchange_kind
from graft.exchange.live import exchange_live
from graft.seeds import step_seed
from graft.storage.checkpoint import checkpoint_step, list_checkpoints
from graft.trainer import loop
from graft.types import Prompt, RolloutGroup

ARMS = ("grpo", "graft", "all")


# ----------------------------------------------------------------------------- statistics (pure)

def paired_summary(diffs: list[tuple[tuple, float]], resamples: int = 2000, seed: int = 0) -> dict:
    """Mean of per-prompt paired differences and its 95 % cluster-bootstrap interval.

    ``diffs``: ``[(state, d), ...]``, ``state`` any hashable (seed, step). States are resampled with
    replacement, then prompts within each drawn state. Hand-worked: ``[((1, 1), 0.5), ((1, 1), 0.0),
    ((2, 1), 0.25)]`` -> mean 0.25 over 3 prompts in 2 states.
    """
    if not diffs:
        return {"mean": None, "ci95": [None, None], "prompts": 0, "states": 0}
    by_state: dict = {}
    for state, d in diffs:
        by_state.setdefault(state, []).append(d)
    states = list(by_state.values())
    rng = random.Random(seed)
    means = []
    for _ in range(resamples):
        pick = [states[rng.randrange(len(states))] for _ in states]
        xs = [x[rng.randrange(len(x))] for s in pick for x in [s] for _ in s]
        means.append(sum(xs) / len(xs))
    means.sort()
    lo, hi = means[int(0.025 * resamples)], means[min(resamples - 1, int(0.975 * resamples))]
    ds = [d for _, d in diffs]
    return {"mean": sum(ds) / len(ds), "ci95": [lo, hi], "prompts": len(ds), "states": len(states)}


def summarize_rows(rows: list[dict]) -> dict:
    """Per direction and kind, ``graft - grpo`` and ``all - grpo`` (:func:`paired_summary`), plus the
    treatment's size: selected prompts, admitted and admitted-correct peer responses per arm."""
    out: dict = {"graft_minus_grpo": {}, "all_minus_grpo": {}, "treatment": {}}
    for d in sorted({r["direction"] for r in rows}):
        mine = [r for r in rows if r["direction"] == d]
        for arm in ("graft", "all"):
            out[f"{arm}_minus_grpo"][d] = {
                kind: paired_summary([((r["seed"], r["step"]), r["success"][arm] - r["success"]["grpo"])
                                      for r in mine if r["kind"] == kind])
                for kind in ("replaced", "unseen")}
        sel = [r for r in mine if r["kind"] == "replaced"]
        out["treatment"][d] = {"states": len({(r["seed"], r["step"]) for r in mine}), "selected_prompts": len(sel),
                               **{f"admitted/{a}": sum(r["admitted"][a] for r in sel) for a in ("graft", "all")},
                               **{f"admitted_correct/{a}": sum(r["admitted_correct"][a] for r in sel) for a in ("graft", "all")}}
    return out


# ----------------------------------------------------------------------------- the measurement

def _snapshot(learner) -> dict:
    """The receiver's weights and optimizer state, copied once: tensors shared by several state-dict keys
    (tied embeddings: Gemma-3's 262k x 640 table) are cloned once and stay shared."""
    clones: dict[int, torch.Tensor] = {}
    weights = {k: clones.setdefault(id(v), v.detach().clone())
               for k, v in learner.policy.model.state_dict(keep_vars=True).items()}
    return {"weights": weights, "optimizer": copy.deepcopy(learner.optimizer.state_dict())}


def _restore(learner, snap: dict) -> None:
    """Back to ``snap``: weights and optimizer moments copied in place."""
    learner.policy.model.load_state_dict(snap["weights"])
    learner.optimizer.restore(snap["optimizer"])
    learner.workers.call("weights_changed", [()], "weights_changed")


def success_rates(run, learner, prompts: list[Prompt], samples: int, step: int) -> list[float]:
    """Share of ``samples`` responses of ``learner`` graded correct, per prompt; prompt p samples from the
    seed of (run seed, step, p's id) in every arm."""
    if not prompts:
        return []
    rc = run.cfg.rollout
    ids = [learner.codec.encode_prompt(p.problem) for p in prompts]
    seeds = [step_seed(run.cfg.seed, step, f"onestep/{learner.name}/{p.id}") for p in prompts]
    out = learner.generate(ids, n=samples, max_new_tokens=rc.max_new_tokens, temperature=rc.temperature, top_p=rc.top_p,
                           batch_size=rc.batch_size, seeds=seeds)
    rewards, _ = run.grader.grade([s.text for ss in out for s in ss], [p.answer for p in prompts for _ in range(samples)])
    return [sum(rewards[i * samples:(i + 1) * samples]) / samples for i in range(len(prompts))]


def unseen_pool(cfg, train: list[Prompt], per_family: int = 64) -> dict[str, list[Prompt]]:
    """Per family of the training task, up to ``per_family`` distinct problems that are not training
    problems (drawn from the family's generator with its own seed; ``square`` has few problems)."""
    ar, seen = cfg.data.arithmetic, {p.problem for p in train}
    out: dict[str, list[Prompt]] = {}
    for fam in dict.fromkeys(ar.families):
        rng, found = random.Random(f"{ar.seed}/unseen/{fam}"), []
        for _ in range(50 * per_family):
            problem, answer = FAMILIES[fam](rng, ar.max_operand)
            if problem not in seen:
                seen.add(problem)
                found.append(Prompt(f"unseen-{fam}-{len(found):05d}", problem, str(answer)))
                if len(found) == per_family:
                    break
        out[fam] = found
    return out


def measure_state(run, groups: dict[str, list[RolloutGroup]], step: int, pool, samples: int, unseen: int) -> list[dict]:
    """The three updates of every receiver at this state and their success rates; leaves every model
    updated with its own groups (the GRPO trajectory)."""
    cfg, names = run.cfg, list(run.learners)
    adv = (cfg.update.adv_eps, cfg.update.adv_std == "unbiased")
    ex = {arm: exchange_live(step, copy.deepcopy(groups), run.learners, cfg.rollout.n,
                             cfg.exchange if arm == "graft" else replace(cfg.exchange, admission="all"), Scoring.of(cfg),
                             run.grade, torch.Generator().manual_seed(step_seed(cfg.seed, step, "exchange")), adv)
          for arm in ("graft", "all")}
    rng = random.Random(step_seed(cfg.seed, step, "onestep/unseen"))
    rows = []
    for r in names:
        audits = {arm: [a for a in e.audit if a["receiver"] == r] for arm, e in ex.items()}
        targets = []   # (direction, prompt, kind, admitted per arm, admitted correct per arm, k_source)
        for a in audits["graft"]:
            d = f"{a['source']}->{r}"
            other = next(x for x in audits["all"] if x["source"] == a["source"])
            for pid in a["selected"]:
                g = next(g for g in groups[r] if g.prompt_id == pid)
                counts = {arm: [x for x in au["responses"] if x["prompt_id"] == pid and x["admitted"]]
                          for arm, au in (("graft", a), ("all", other))}
                k_src = next(c["k_source"] for c in a["candidates"] if c["prompt_id"] == pid)
                base = dict(direction=d, admitted={k: len(v) for k, v in counts.items()},
                            admitted_correct={k: sum(x["reward_source"] > 0.5 for x in v) for k, v in counts.items()},
                            k_source=k_src)
                targets.append((Prompt(pid, g.problem, g.answer), "replaced", base))
                fam = pool.get(family_of(pid), [])
                for q in rng.sample(fam, min(unseen, len(fam))):
                    targets.append((q, "unseen", {**base, "replaced_by": pid}))
        snap = _snapshot(run.learners[r])
        success = {}
        for arm in ("graft", "all", "grpo"):
            _restore(run.learners[r], snap)
            loop.update_model(run, r, groups[r] if arm == "grpo" else ex[arm].train_groups[r], step)
            success[arm] = success_rates(run, run.learners[r], [t[0] for t in targets], samples, step)
        del snap   # before the next receiver's snapshot is taken
        for i, (p, kind, base) in enumerate(targets):
            rows.append({"step": step, "prompt_id": p.id, "family": family_of(p.id.removeprefix("unseen-")),
                         "kind": kind, **base, "success": {arm: success[arm][i] for arm in ARMS}})
    return rows


def run_seed(cfg, at: list[int], samples: int, unseen: int, record, log) -> None:
    """One GRPO trajectory up to the last measured step; ``record(step, rows)`` as each state is measured."""
    run = loop.setup(cfg)
    try:
        if any(lr.workers.size != 1 for lr in run.learners.values()):
            raise ConfigError("graft onestep runs with backend: local (one rank per model)")
        pool = unseen_pool(cfg, run.sampler.prompts)
        for step in range(1, max(at) + 1):
            t0 = time.perf_counter()
            prompts, _ = run.sampler.next_batch()
            groups, _ = loop.rollout_phase(run, prompts, step)
            metrics = {"step": step} | loop.score_phase(run, groups)
            if step in at:
                new = [{"seed": cfg.seed, **x} for x in measure_state(run, groups, step, pool, samples, unseen)]
                record(step, new)
                log(f"seed {cfg.seed} step {step}: measured {len(new)} prompts "
                    f"({sum(x['kind'] == 'replaced' for x in new)} replaced) in {time.perf_counter() - t0:.0f} s")
            else:
                loop.update_phase(run, groups, step)
                log(f"seed {cfg.seed} step {step}: GRPO step in {time.perf_counter() - t0:.0f} s")
            run.metrics.write(metrics)
    finally:
        loop.close_run(run)


def checkpoint_states(run_dir: Path, at: list[int]) -> dict[int, Path | None]:
    """The checkpoint each measured step starts from: step s needs the run's checkpoint of step s - 1
    (s = 1 starts from the base weights: None)."""
    have = {checkpoint_step(p): p for p in list_checkpoints(run_dir)}
    missing = [s for s in at if s > 1 and s - 1 not in have]
    if missing:
        raise ConfigError(f"--from {run_dir}: measuring step(s) {missing} needs its checkpoint(s) of step(s) "
                          f"{[s - 1 for s in missing]}; it has {sorted(have) or 'none'} (a run keeps them with "
                          "checkpoint.save_every and checkpoint.keep_last)")
    return {s: have.get(s - 1) for s in at}


def _link_tree(src: Path, dst: Path) -> None:
    """``dst`` mirrors ``src`` with hard links (a copy where the file system has none): no disk spent."""
    for root, _, files in os.walk(src):
        target = dst / Path(root).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for f in files:
            try:
                os.link(Path(root) / f, target / f)
            except OSError:
                shutil.copy2(Path(root) / f, target / f)


def from_run_config(run_dir: Path, overrides: list[str]):
    """A finished GRPO run's config (its ``config.yaml`` plus ``overrides``); refused when the run exchanged."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"--from {run_dir}: no config.yaml (not a graft run folder)")
    cfg = load_config(path, overrides)
    if exchange_kind(cfg) != "none":
        raise ConfigError(f"--from {run_dir}: the run exchanged ({exchange_kind(cfg)}); onestep measures along a GRPO "
                          "trajectory (exchange.mode=grpo)")
    return cfg


def measure_from_run(run_dir: Path, overrides: list[str], out: Path, at: list[int], samples: int, unseen: int,
                     record, log) -> None:
    """``at``'s states of a finished GRPO run, each resumed from its checkpoint of the step before in a
    scratch folder of hard links (removed afterwards); ``record(step, rows)`` as each state is measured."""
    cfg0 = from_run_config(run_dir, overrides)
    for step, ckpt in checkpoint_states(run_dir, at).items():
        t0 = time.perf_counter()
        scratch = out / f"seed{cfg0.seed}" / f"from-step{step}"
        shutil.rmtree(scratch, ignore_errors=True)
        if ckpt is not None:
            _link_tree(ckpt, scratch / "checkpoints" / ckpt.name)
        cfg = load_config(run_dir / "config.yaml", [*overrides, f"run_dir={scratch}", f"resume={ckpt is not None}".lower(),
                                                     "checkpoint.save_every=0", "checkpoint.save_final=false"])
        run = loop.setup(cfg)
        try:
            assert run.start_step == step, (run.start_step, step)
            prompts, _ = run.sampler.next_batch()
            groups, _ = loop.rollout_phase(run, prompts, step)
            loop.score_phase(run, groups)
            new = [{"seed": cfg.seed, **x} for x in measure_state(run, groups, step, unseen_pool(cfg, run.sampler.prompts),
                                                                  samples, unseen)]
        finally:
            loop.close_run(run)
        shutil.rmtree(scratch, ignore_errors=True)
        record(step, new)
        log(f"{run_dir} step {step}: measured {len(new)} prompts ({sum(x['kind'] == 'replaced' for x in new)} replaced) "
            f"in {time.perf_counter() - t0:.0f} s")


def _read_rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def measured_states(out: Path) -> dict[int, set[int]]:
    """The (seed -> steps) already measured into ``out`` (``measured.json``): each is skipped when run again."""
    path = out / "measured.json"
    return {int(k): set(v) for k, v in json.loads(path.read_text()).items()} if path.exists() else {}


def record_state(out: Path, seed: int, step: int, new: list[dict]) -> None:
    """Store one measured state: its rows replace any earlier rows of (seed, step) in ``rows.jsonl`` (kept in
    (seed, step) order), then ``measured.json`` lists it -- a state whose rows were written but not listed
    (killed in between) is measured again and its rows replaced."""
    rows = [r for r in _read_rows(out / "rows.jsonl") if (r["seed"], r["step"]) != (seed, step)] + new
    rows.sort(key=lambda r: (r["seed"], r["step"]))
    _write_atomic(out / "rows.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    done = measured_states(out)
    done.setdefault(seed, set()).add(step)
    _write_atomic(out / "measured.json", json.dumps({str(k): sorted(v) for k, v in sorted(done.items())}) + "\n")


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="graft onestep", description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", help="the config whose GRPO trajectories are trained (not with --from)")
    ap.add_argument("overrides", nargs="*", help="key=value config overrides (the study's regime)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1])
    ap.add_argument("--from", dest="from_runs", nargs="+", default=None, metavar="RUN_DIR",
                    help="measure along these finished GRPO runs (their checkpoints) instead of training trajectories")
    ap.add_argument("--at", type=int, nargs="+", required=True, help="training steps at which to measure (1 = base weights)")
    ap.add_argument("--samples", type=int, default=16, help="samples per prompt and arm (>= 16)")
    ap.add_argument("--unseen", type=int, default=4, help="unseen prompts of the same family per replaced prompt")
    ap.add_argument("--out", required=True)
    args = ap.parse_intermixed_args(argv)
    if min(args.at) < 1 or args.samples < 1 or args.unseen < 0:
        raise ConfigError("--at steps must be >= 1, --samples >= 1, --unseen >= 0")
    if args.from_runs is not None:   # the run's own config.yaml: every positional argument is an override
        args.overrides = [x for x in [args.config, *args.overrides] if x is not None]
        args.config = None
        bad = [x for x in args.overrides if "=" not in x]
        if bad:
            raise ConfigError(f"with --from the config is each run's config.yaml; {bad[0]!r} is not a key=value override")
    elif args.config is None:
        raise ConfigError("graft onestep needs a config (whose GRPO trajectories it trains) or --from RUN_DIR ...")
    return args


def _check_pair_task(cfg) -> None:
    if cfg.data.train != "arithmetic" or not cfg.data.arithmetic.families:
        raise ConfigError("graft onestep needs the procedural task with data.arithmetic.families "
                          "(unseen prompts are drawn per family)")
    if len(cfg.models) != 2:
        raise ConfigError(f"graft onestep measures a pair; the config has {len(cfg.models)} models")


def _units(args, out: Path) -> list[tuple[int, object]]:
    """(seed, how to measure it) per trajectory: a config to train along, or a finished run's folder."""
    at = sorted(set(args.at))
    if args.from_runs is not None:
        units = []
        for run_dir in map(Path, args.from_runs):
            cfg = from_run_config(run_dir, args.overrides)
            _check_pair_task(cfg)
            checkpoint_states(run_dir, at)   # every needed checkpoint is there before anything runs
            units.append((cfg.seed, run_dir))
        seeds = [s for s, _ in units]
        if len(set(seeds)) != len(seeds):
            raise ConfigError(f"--from: two runs share a seed ({seeds}); rows are keyed by seed")
        return units
    units = []
    for seed in args.seeds:
        cfg = load_config(args.config, [*args.overrides, f"seed={seed}", f"run_dir={out / f'seed{seed}'}",
                                        "resume=false", "checkpoint.save_every=0", "checkpoint.save_final=false"])
        _check_pair_task(cfg)
        units.append((seed, cfg))
    return units


def onestep_main(argv: list[str]) -> int:
    args = _parse(argv)
    out = Path(args.out)
    at = sorted(set(args.at))
    units = _units(args, out)
    out.mkdir(parents=True, exist_ok=True)
    log = lambda s: print(f"[onestep] {s}", file=sys.stderr, flush=True)  # noqa: E731
    for seed, how in units:
        todo = [s for s in at if s not in measured_states(out).get(seed, set())]
        if not todo:
            log(f"seed {seed}: steps {at} measured, skipped")
            continue
        record = lambda step, new, seed=seed: record_state(out, seed, step, new)  # noqa: E731
        if isinstance(how, Path):
            measure_from_run(how, args.overrides, out, todo, args.samples, args.unseen, record, log)
        else:
            shutil.rmtree(out / f"seed{seed}", ignore_errors=True)
            run_seed(how, todo, args.samples, args.unseen, record, log)
    rows = _read_rows(out / "rows.jsonl")
    command = ["graft", "onestep", *argv]
    earlier = json.loads((out / "summary.json").read_text()).get("commands", []) if (out / "summary.json").exists() else []
    summary = {"command": command, "commands": earlier + [command] * (command not in earlier), **summarize_rows(rows),
               "states": {"measured": sum(len(v) for v in measured_states(out).values()),
                          "with_exchange": len({(r["seed"], r["step"]) for r in rows})}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for d, kinds in summary["graft_minus_grpo"].items():
        for kind, s in kinds.items():
            if s["mean"] is not None:
                log(f"{d} {kind}: graft - grpo {100 * s['mean']:+.2f} points, 95 % CI "
                    f"[{100 * s['ci95'][0]:+.2f}, {100 * s['ci95'][1]:+.2f}] over {s['prompts']} prompts, {s['states']} states")
    print(out / "summary.json")
    return 0
