"""``graft bench``'s argument parsers and its dispatch, in a module that does not import torch (the measurements'
modules do): ``graft bench --help`` and ``graft bench MEASUREMENT --help`` are answered from here
(:data:`graft.commands.cli.PARSERS`), and ``graft bench gpu-check`` loads no more than its own module.

``graft bench [flags]`` compares graft with references (:mod:`graft.bench.cli`); ``graft bench MEASUREMENT [flags]``
runs one measurement of :data:`MEASUREMENTS` (the name first, then that measurement's own flags)."""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from typing import Callable, Sequence

from graft.bench.trl_settings import TRL_DIFFERENCES, TRL_MATCHED, doc_list

BENCH_MODEL = "embedded:smollm2-135m-instruct"
"""``graft bench``'s model of part (a)."""


class BenchParser(argparse.ArgumentParser):
    """``graft bench``'s parser. With a measurement's name first (``graft bench rollout-batch --reps 2``) the rest is
    parsed by that measurement's own parser and the namespace's ``measurement`` names it; otherwise ``measurement`` is
    None and the arguments are the comparison's."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        argv = list(sys.argv[1:] if args is None else args)
        if argv and argv[0] in MEASUREMENTS:
            ns, rest = MEASUREMENTS[argv[0]][0]().parse_known_args(argv[1:], namespace)
            ns.measurement = argv[0]
            return ns, rest
        ns, rest = super().parse_known_args(argv, namespace)
        ns.measurement = None
        return ns, rest

    def subcommands(self) -> dict[str, argparse.ArgumentParser]:
        """Every measurement's parser by name (the command reference lists them under ``graft bench``)."""
        return {name: build() for name, (build, _) in MEASUREMENTS.items()}


def bench_parser() -> argparse.ArgumentParser:
    """``graft bench``'s argument parser."""
    p = BenchParser(
        prog="graft bench",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Time graft's GRPO step against TRL (a), graft's rollout against model.generate (b) and the GRAFT "
        "step against the GRPO step (c), alternating repetitions; medians and raw values.\n\nOne measurement of its "
        f"own: graft bench MEASUREMENT [flags], MEASUREMENT one of {', '.join(MEASUREMENTS)} (each with --help).",
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


def _measurement(name: str, description: str, **kw) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=f"graft bench {name}", description=description, **kw)


def _config_flags(p: argparse.ArgumentParser, reps: int, out: str) -> None:
    """``--config``, ``--reps``, ``--out`` and the ``key=value`` overrides every in-process measurement takes."""
    p.add_argument("--config", default=None, help="YAML config or packaged config's name (default: configs/default.yaml)")
    p.add_argument("--reps", type=int, default=reps, help=f"repetitions of every side (default {reps})")
    p.add_argument("--out", default=None, help=out)
    p.add_argument("overrides", nargs="*", help="key=value config overrides, applied to every side")


def train_step_parser() -> argparse.ArgumentParser:
    """``graft bench train-step``'s argument parser."""
    p = _measurement(
        "train-step",
        "Whole training steps as `graft train` runs them, one process per run, sides alternating run by run: this "
        "checkout's code, another checkout's (--old) and/or this code with extra overrides (--recipe). All sides read "
        "the same config with the same seed, so step 1 trains on the same prompts with the same sampling seeds. "
        "Prints per side the medians over steps 2..K of step, rollout and update seconds, generated and update tokens "
        "per second (the figures that do not depend on how much work the samples made), model GFLOP/s and their share "
        "of this host's fp32 matmul peak; step 1 apart.",
    )
    p.add_argument("--old", default=None, help="checkout of another commit: a side running its code")
    p.add_argument("--new", default=None, help="checkout whose code the other sides run (default: this graft's)")
    p.add_argument("--recipe", action="append", default=[], help="key=value (repeatable): a side on --new's code with these")
    p.add_argument("--steps", type=int, default=4, help="training steps per run (default 4; at least 2)")
    _config_flags(p, 2, "JSON file for the medians and every step's figures")
    return p


def rollout_phase_parser() -> argparse.ArgumentParser:
    """``graft bench rollout-phase``'s argument parser."""
    p = _measurement(
        "rollout-phase",
        "The trainer's rollout phase of a config's models two ways, alternating in one process, on step 1's prompts "
        "and seeds after one untimed warm-up. --compare claim: threads_per_model empty (one model after the other on "
        "`threads` threads) vs threads_per_model={rollout: 1} with threads_claim_freed=true (side by side, one thread "
        "each, the one still sampling taking the other's once it is free). --compare prefix: every model's "
        "common_prefix off vs on. Prints seconds and tokens generated per repetition and how many responses are token "
        "for token the same on both sides.",
    )
    p.add_argument("--compare", choices=("claim", "prefix"), default="claim", help="the two ways (default claim)")
    _config_flags(p, 3, "JSON file for every repetition's seconds and tokens")
    return p


def rollout_batch_parser() -> argparse.ArgumentParser:
    """``graft bench rollout-batch``'s argument parser."""
    p = _measurement(
        "rollout-batch",
        "Every model's rollout of step 1's prompts at several generation batch sizes (rollout.batch_size), sizes "
        "alternating within each repetition, with the seeds, templates and stop strings of training. Prints seconds, "
        "generated tokens per second and the speed-up against the first size (medians), and how many responses are "
        "token for token those of the first size: per-sample seeds make samples independent of the batching, so only "
        "a matmul that rounds differently at another row count changes one.",
    )
    p.add_argument("--sizes", default="64,128", help="comma-separated batch sizes, the first the reference (default 64,128)")
    _config_flags(p, 2, "JSON file for every repetition's rows")
    return p


def update_precision_parser() -> argparse.ArgumentParser:
    """``graft bench update-precision``'s argument parser."""
    p = _measurement(
        "update-precision",
        "Every model's update of step 1 in fp32 and under bfloat16 autocast (models.I.autocast), alternating, at "
        "equal work: the same groups, from the same weights and optimiser state (restored before each run), after "
        "recomputing the behaviour log-probs in the precision under test. Prints seconds per model and precision "
        "(medians), the update tokens, and the loss and mean ratio each precision gave.",
    )
    _config_flags(p, 2, "JSON file for every repetition's rows")
    return p


def rollout_profile_parser() -> argparse.ArgumentParser:
    """``graft bench rollout-profile``'s argument parser."""
    p = _measurement(
        "rollout-profile",
        "Where a training step's time goes, per model of the config: a torch.profiler breakdown of the fp32 sampler, "
        "the bf16 sampler (rollout.engine=hf-bf16), the fp32 forward that recomputes the behaviour log-probs, the "
        "update's forward and backward over the sampled responses, and one AdamW step, into the LM head, the body's "
        "matmuls, attention, other operators and the time outside operators.",
    )
    p.add_argument("--config", default=None, help="YAML config or packaged config's name (default: configs/default.yaml)")
    p.add_argument("--prompts", type=int, default=4, help="prompts (default 4)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="response length limit (default 48)")
    p.add_argument("--out", default=None, help="folder for profile.json and profile.md")
    return p


def code_grading_parser() -> argparse.ArgumentParser:
    """``graft bench code-grading``'s argument parser."""
    p = _measurement(
        "code-grading",
        "What grading one program of the code domain costs: seconds per program, one program after another as a "
        "grader worker grades them (each row's reference solution, then a wrong program), in a fresh interpreter per "
        "checkout and repetition, this checkout's code and another's (--old) alternating. Prints the medians and each "
        "side's ratio to the first. Needs bubblewrap, as the code domain does.",
    )
    p.add_argument("--old", default=None, metavar="CHECKOUT", help="checkout of another commit: a side running its code")
    p.add_argument("--new", default=None, metavar="CHECKOUT", help="checkout of the other side (default: this graft's)")
    p.add_argument("--rows", type=int, default=64, help="rows of the built-in code task graded per repetition (default 64)")
    p.add_argument("--reps", type=int, default=3, help="repetitions of every side (default 3)")
    p.add_argument("--out", default=None, help="JSON file for every repetition's figures")
    return p


def gpu_check_parser() -> argparse.ArgumentParser:
    """``graft bench gpu-check``'s argument parser."""
    about = (
        "One GRAFT step of two random-weight models shaped like the embedded pair (Llama with SmolLM2's tokenizer, "
        "Gemma-3 with its own) on a GPU in bf16, with rollout and training tokens/s per model and engine; one JSON "
        "line (gpu_check: RESULT ...) at the end. Only the tokenizers travel (--prepare copies them to "
        "runs/gpu_check_assets). Exit 2 without CUDA unless --device cpu. scripts/gpu_check.sh runs it under a "
        "time limit."
    )
    examples = (
        "  graft bench gpu-check                          # CUDA, bf16, SmolLM2-135M / Gemma-3-270M shapes\n"
        "  graft bench gpu-check --device cpu --dry-run   # CPU smoke test of the same path (tiny models)\n"
        "  graft bench gpu-check --prepare                # copy the two tokenizers to runs/gpu_check_assets"
    )
    p = _measurement(
        "gpu-check", textwrap.fill(about, 100) + "\n\n" + examples, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dry-run", action="store_true", help="tiny models and a tiny batch (CPU smoke test)")
    p.add_argument("--prepare", action="store_true", help="copy the tokenizers to runs/gpu_check_assets and exit")
    p.add_argument("--prompts", type=int, default=None, help="prompts per step (default 64; dry run 2)")
    p.add_argument("--n", type=int, default=None, help="samples per prompt (default 8; dry run 2)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 256; dry run 8")
    p.add_argument(
        "--engines",
        default="hf,hf-cb,vllm",
        help="rollout engines to measure (the step itself uses the first); unavailable ones are skipped",
    )
    p.add_argument("--budget-s", type=float, default=240.0, help="skip the extra engine measurements past this")
    return p


MEASUREMENTS: dict[str, tuple[Callable[[], argparse.ArgumentParser], str]] = {
    "train-step": (train_step_parser, "graft.bench.train_step"),
    "rollout-phase": (rollout_phase_parser, "graft.bench.rollout_phase"),
    "rollout-batch": (rollout_batch_parser, "graft.bench.rollout_batch"),
    "update-precision": (update_precision_parser, "graft.bench.update_precision"),
    "rollout-profile": (rollout_profile_parser, "graft.bench.rollout_profile"),
    "code-grading": (code_grading_parser, "graft.bench.code_grading"),
    "gpu-check": (gpu_check_parser, "graft.bench.gpu_check"),
}
"""``graft bench MEASUREMENT``: name -> (its parser, the module whose ``run(args)`` measures)."""


def bench_main(argv: list[str]) -> int:
    """``graft bench``: the measurement ``argv`` names first, else the comparison with references
    (:func:`graft.bench.cli.run`); the module that measures is imported only now."""
    args = bench_parser().parse_args(argv)
    module = MEASUREMENTS[args.measurement][1] if args.measurement else "graft.bench.cli"
    return importlib.import_module(module).run(args)
