"""``graft experiment``: a seeded comparison of arms (GRPO, GRAFT, ablations, stored peers), run
resumably one training run at a time, each final checkpoint evaluated, everything summarised.

    graft experiment run configs/experiments/mini-repro.yaml [--max-minutes 85] [--only ARM ...]
    graft experiment summarize configs/experiments/mini-repro.yaml
    graft experiment status configs/experiments/mini-repro.yaml    # which runs are done, where each stands

A plan (YAML) names a base training config, common overrides, seeds, arms (each a list of
overrides, optionally its own seeds), the evaluation data and what the report compares::

    name: mini-repro
    config: ../default.yaml            # relative to the plan file, or a packaged preset's name (baselines/dapo)
    runs: runs/mini-repro              # run folders (checkpoints, stores: large, not committed)
    results: results/mini-repro        # small files per run + summary.json + REPORT.md (committed)
    overrides: [steps=24, batch_prompts=8]
    seeds: [1, 2, 3]
    arms:
      grpo_n8: [exchange.kind=none]
      graft_n8: []
      grpo_n16: {overrides: [exchange.kind=none, rollout.n=16], seeds: [1]}
      peer_first: {overrides: [update.order=peer_first], seeds: [1]}
    stored: {from: grpo_n8, seeds: [1]}  # each model trained alone on the other's stored groups of that arm
    eval: {data: {test: ../../results/mini-repro/data/test.jsonl}, n: 8, temperature: 0.6, top_p: 0.95}
    order: [grpo_n8/1, graft_n8/1, stored_A/1, ...]   # optional run order; unlisted runs follow, arm by arm
    keep_checkpoints: false            # delete a run's checkpoints once its final one is evaluated (true: keep
                                       # all; [ARM or ARM/SEED, ...]: keep those, e.g. for `graft onestep --from`)
    base: true                         # also evaluate the starting weights once (summary.json "base")
    # what summarize compares (each optional; a plan without comparisons reports none)
    title: GRAFT vs GRPO               # REPORT.md's heading: "# NAME: TITLE on MODELS"
    comparisons:                       # NAME: ARM minus BASELINE, seed by seed (summary.json paired_diff_NAME)
      graft_minus_grpo_n8: {arm: graft_n8, baseline: grpo_n8}
      # a pre-registered test: a verdict on MODEL's difference once PAIRS seeds are paired (summary.json
      # decision_NAME; "confirmed" iff the Student-t 95 % interval lies above 0, no verdict before)
      confirm_gain: {arm: graft_n8, baseline: grpo_n8, decision: {model: gemma3, pairs: 8}}
    labels: {grpo_n8: GRPO n=8, graft_n8: GRAFT n=8}   # an arm's name in the report's sentences (default: ARM)
    clip_frac_peer: {peer_last: graft_n8, peer_first: peer_first}   # NAME: ARM whose peer-token clip rate it reports
    onestep: ../../results/study/onestep/summary.json   # a `graft onestep` summary: summary.json one_step_effect

A comparison whose baseline is the arm the stored peers' groups come from (``stored.from``) also sets the
stored runs' gain over that baseline beside the compared arm's (summary.json ``stored_vs_online``).

``run`` goes through the plan in order, arm by arm and seed by seed: a run whose ``summary.json``
exists is skipped, and so is one whose results are already recorded under ``results/`` (committed
from another machine), a run with a checkpoint is resumed, the others start; each finished run's final
checkpoint is evaluated per model (``graft eval`` with the run's own prompt format), analysed
(``graft analyze``: ``analysis.json``, ``analyze.txt``) and its small files are copied to
``results/ARM/seedS/``. ``--max-minutes`` stops starting new runs after that
long, so the whole plan runs as resumable pieces. Every run is the command printed before it
starts; rerunning it alone gives the same training metrics (same seed, same samples). Several
``run`` processes on one plan share the work (one per core with ``threads=1``, or one per machine on a
shared folder): each claims the run it works on and skips the runs the others hold.

The command's parts, by job: :mod:`.plan` (read and check a plan), :mod:`.run` (``run``, ``status``),
:mod:`.summary` (``summary.json``), :mod:`.report` (``REPORT.md`` and its plots).
"""

from __future__ import annotations

import json
import shlex
import sys

from graft.commands.experiment.plan import Comparison, Member, Plan, load_plan
from graft.commands.experiment.report import decision_lines, report_markdown, write_summary
from graft.commands.experiment.run import check_only, plan_status, run_plan
from graft.commands.experiment.summary import summarize
from graft.commands.parsers import experiment_parser

__all__ = [
    "Comparison",
    "Member",
    "Plan",
    "experiment_main",
    "load_plan",
    "plan_status",
    "report_markdown",
    "run_plan",
    "summarize",
    "write_summary",
]


def experiment_main(argv: list[str]) -> int:
    args = experiment_parser().parse_args(argv)
    plan = load_plan(args.plan)
    check_only(plan, args.only)
    if args.action == "status":
        rows = plan_status(plan)
        width = max(len(f"{r['arm']}/seed{r['seed']}") for r in rows) if rows else 0
        for r in rows:
            print(f"{r['arm'] + '/seed' + str(r['seed']):<{width}}  {r['state']}")
        done = sum(r["state"] in ("done", "results only") for r in rows)
        print(
            f"[experiment {plan.name}] {done} of {len(rows)} runs finished; `graft experiment run` does the rest"
            if done < len(rows)
            else f"[experiment {plan.name}] all {len(rows)} runs finished"
        )
        return 0
    if args.action == "print":
        for m in plan.members:
            print(shlex.join(m.command(plan.config)))
        return 0
    if args.action == "run":
        left = run_plan(plan, args.max_minutes, args.only)
        print(
            f"[experiment {plan.name}] {len(left)} run(s) left" if left else f"[experiment {plan.name}] all runs done",
            file=sys.stderr,
        )
    path = write_summary(plan)
    for line in decision_lines(plan, json.loads(path.read_text())):
        if line:
            print(line.replace("**", ""))
    print(f"summary: {path}; report: {plan.results / 'REPORT.md'}")
    return 0
