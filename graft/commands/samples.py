"""``graft samples RUN``: the command of :mod:`graft.evaluation.samples` (what it picks from, and how, is
described there)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from graft.commands.parsers import samples_parser
from graft.domains.base import run_domain
from graft.evaluation.samples import (
    Sample,
    SamplesError,
    collect,
    format_sample,
    parse_steps,
    pick,
    pick_mixed,
    rewarded,
    run_threshold,
)


def samples_main(argv: list[str]) -> int:
    try:
        args = samples_parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if args.n < 0 or args.width < 2:
        raise SamplesError(f"-n must be >= 0 and --width >= 2 (got -n {args.n}, --width {args.width})")
    threshold = run_threshold(Path(args.run))
    everything = collect(Path(args.run), args.source, args.model, parse_steps(args.steps), args.reward, threshold, args.data)
    if args.reward == "both":
        chosen = pick_mixed(everything, args.n, args.seed, threshold)
    else:
        chosen = pick(everything, args.n, args.seed)
    domain = run_domain(Path(args.run))
    if args.json:
        for s in chosen:
            print(json.dumps(asdict(s) | {"flags": s.flags(domain)}))
        return 0
    what = {"1": "rewarded ", "0": "unrewarded ", "any": "", "both": ""}[args.reward]
    noun = {"train": "training rollouts", "peer": "admitted peer responses", "eval": "held-out responses"}[args.source]
    print(
        f"{len(chosen)} of {len(everything)} {what}{noun}"
        + (f" {'into' if args.source == 'peer' else 'of'} {args.model}" if args.model else "")
        + (f", steps {args.steps}" if args.steps else "")
        + (_split(chosen, everything, threshold) if args.reward == "both" else "")
        + f" (seed {args.seed})"
    )
    for s in chosen:
        print(format_sample(s, domain, args.width))
    return 0


def _split(chosen: list[Sample], everything: list[Sample], threshold: float) -> str:
    """``: 6 of 9 rewarded, 6 of 240 not``: how a mixed pick splits (rewarded: above ``threshold``)."""
    good, all_good = (sum(rewarded(s.reward, threshold) for s in xs) for xs in (chosen, everything))
    return f": {good} of {all_good} rewarded, {len(chosen) - good} of {len(everything) - all_good} not"
