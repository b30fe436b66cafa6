"""``graft bench``'s argument parser, in a module that does not import torch (graft/bench/cli.py does): ``graft bench
--help`` is answered from here (:data:`graft.commands.cli.PARSERS`)."""

from __future__ import annotations

import argparse

from graft.bench.trl_settings import TRL_DIFFERENCES, TRL_MATCHED, doc_list

BENCH_MODEL = "embedded:smollm2-135m-instruct"
"""``graft bench``'s model of part (a)."""


def bench_parser() -> argparse.ArgumentParser:
    """``graft bench``'s argument parser."""
    p = argparse.ArgumentParser(
        prog="graft bench",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Time graft's GRPO step against TRL (a), graft's rollout against model.generate (b) and the GRAFT "
        "step against the GRPO step (c), alternating repetitions; medians and raw values.",
        epilog=doc_list("TRL settings matched in (a):", TRL_MATCHED) + doc_list("Differences that remain:", TRL_DIFFERENCES),
    )
    p.add_argument("--only", default="a,b,c", help="parts to run, comma-separated subset of a,b,c (default: all)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per side (default 3)")
    p.add_argument("--model", default=BENCH_MODEL, help=f"model of part a (default {BENCH_MODEL})")
    p.add_argument("--models", default=None, help="comma-separated models of part b (default: the config's models)")
    p.add_argument(
        "--config",
        default=None,
        help="YAML config (default: configs/default.yaml); its model entries give "
        "templates and learning rates, its pair is part c",
    )
    p.add_argument("--prompts", type=int, default=4, help="prompts per step (default 4)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="response length limit (default 48)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the config's)")
    p.add_argument("--device", default=None, help="auto, cpu or cuda (default: the config's)")
    p.add_argument("--out", default=None, help="folder for bench.json and bench.md")
    p.add_argument(
        "--keep-balance",
        action="store_true",
        help="part c: keep the config's exchange.balance (default: exchange.balance=none so that peer groups are handed over)",
    )
    p.add_argument(
        "--max-tries",
        type=int,
        default=4,
        help="part c: GRAFT steps tried per repetition until one hands peer groups over (default 4)",
    )
    p.add_argument("overrides", nargs="*", help="key=value config overrides (e.g. rollout.temperature=1.0)")
    return p
