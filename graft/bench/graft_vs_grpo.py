"""Part (c) of ``graft bench``: a GRAFT step against a GRPO step on the config's pair, on one live
Run whose ``exchange.kind`` is switched between repetitions (``live`` and ``none``)."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from graft.bench.common import alternate, progress, series, steps_line, summarize
from graft.bench.flops import ModelShape
from graft.bench.runs import close_run, rewound_step, run_shapes, step_row
from graft.config import Config
from graft.exchange.kinds import make_exchange
from graft.trainer.loop import setup, train_step

PAIR_KEYS = (
    "step_s",
    "rollout_s",
    "score_s",
    "exchange_s",
    "update_s",
    "exchange_share",
    "transferred",
    "admitted",
    "peer_responses",
    "tries",
    "peak_rss_gb",
    "rollout_gflops",
    "update_gflops",
    "step_gflops",
)


def exchange_counts(metrics: dict) -> dict:
    """Responses transferred and admitted over all directions of one step's metrics."""
    pick = lambda suffix: sum(v or 0 for k, v in metrics.items() if k.startswith("exchange/") and k.endswith(suffix))  # noqa: E731
    return {"transferred": pick("/transferred"), "admitted": pick("/admitted")}


def pair_row(metrics: dict, shapes: dict[str, ModelShape], tries: int) -> dict:
    """:func:`~graft.bench.runs.step_row` of a pair's step with its exchange counts and share."""
    names = list(shapes)
    row = step_row(metrics, shapes) | exchange_counts(metrics)
    row["peer_responses"] = sum(metrics.get(f"{n}/peer_responses", 0) or 0 for n in names)
    row["exchange_share"] = (row["exchange_s"] or 0.0) / row["step_s"] if row["step_s"] else None
    row["tries"] = tries
    return row


def _switch_exchange(run, kind: str) -> None:
    """Make the live ``run``'s next steps exchange as ``exchange.kind=kind`` would (the run's config is left as it is)."""
    cfg = dataclasses.replace(run.cfg, exchange=dataclasses.replace(run.cfg.exchange, kind=kind))
    run.exchange = make_exchange(cfg, run.learners, run.grade)


class _PairSides:
    """The two sides of (c) on one Run: GRAFT steps on fresh prompts until one hands peer groups
    over (at most ``max_tries``), then a GRPO step on the prompts of that GRAFT step."""

    def __init__(self, run, max_tries: int):
        self.run, self.max_tries = run, max_tries
        self.shapes = run_shapes(run)
        self.steps = itertools.count(1)
        self.state: dict | None = None  # sampler state before the GRAFT step that the next GRPO side repeats

    def graft(self, i: int) -> dict:
        """Repetition ``i`` of the GRAFT side."""
        _switch_exchange(self.run, "live")
        tried = []
        for t in range(1, self.max_tries + 1):
            self.state = self.run.sampler.state_dict()
            m = train_step(self.run, next(self.steps))
            counts = exchange_counts(m)
            tried.append(counts | {"step_s": m.get("time/step_s")})
            if counts["transferred"] > 0:
                break
            progress(
                f"(c) rep {i + 1}: GRAFT step {t}/{self.max_tries} handed nothing over"
                + ("; trying the next prompts" if t < self.max_tries else "; this repetition has no exchange")
            )
        return pair_row(m, self.shapes, t) | {"attempts": tried}

    def grpo(self, i: int) -> dict:
        """Repetition ``i`` of the GRPO side."""
        assert self.state is not None, "alternate() runs graft(i) first, which saves the state (--max-tries >= 1)"
        _switch_exchange(self.run, "none")
        try:
            return pair_row(rewound_step(self.run, self.state, next(self.steps)), self.shapes, 1)
        finally:
            _switch_exchange(self.run, "live")


def _ensured_by(base: Config, keep_balance: bool, max_tries: int) -> str:
    """How (c) makes its GRAFT steps exchange, for the JSON."""
    if keep_balance:
        return f"config balancing exchange.balance={base.exchange.balance}, up to {max_tries} steps per repetition"
    return f"exchange.balance=none, up to {max_tries} steps per repetition"


def bench_c(base: Config, reps: int, run_root: Path, keep_balance: bool, max_tries: int) -> dict:
    """Part (c): GRAFT and GRPO steps alternating on the config's pair."""
    balance = base.exchange.balance if keep_balance else "none"
    exchange = dataclasses.replace(base.exchange, kind="live", balance=balance)
    cfg = dataclasses.replace(base, run_dir=str(run_root / "c"), exchange=exchange)
    progress(f"(c) loading {', '.join(m.path for m in cfg.models)}")
    run = setup(cfg)
    sides = _PairSides(run, max_tries)
    try:
        rows = alternate(
            reps,
            [("graft", sides.graft), ("grpo", sides.grpo)],
            "c",
            lambda r: steps_line(r) + f", transferred {r['transferred']}, admitted {r['admitted']}",
        )
    finally:
        close_run(run)
    exchanged = [r for r in rows["graft"] if r["transferred"] > 0]
    return {
        "models": [m.path for m in cfg.models],
        "exchange_ensured_by": _ensured_by(base, keep_balance, max_tries),
        "repetitions_with_exchange": len(exchanged),
        "graft": summarize(rows["graft"], PAIR_KEYS) | {"raw": rows["graft"]},
        "grpo": summarize(rows["grpo"], PAIR_KEYS) | {"raw": rows["grpo"]},
        "exchange_share_when_exchanged": series([r["exchange_share"] for r in exchanged]),
    }
