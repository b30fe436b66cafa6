"""The argument parsers of the ``graft`` commands (``<command>_parser()``; ``graft bench``'s is in graft/bench/args.py),
in a module that imports neither torch nor the commands' own modules: ``graft COMMAND --help`` is answered from here
(:data:`graft.commands.cli.PARSERS`) without loading the command, whose entry point parses its arguments with the same
parser."""

from __future__ import annotations

import argparse

from graft.config import EvalConfig
from graft.registry import DOMAINS, DTYPES as DTYPES_REGISTRY, ENGINES

CONFIG_HELP = "a YAML config file, or the name of a packaged one (default, code, trio, baselines/grpo_n16, ...)"
"""What a command's config argument takes (:func:`graft.config.config_path`)."""
OVERRIDES_HELP = "key=value overrides, e.g. steps=10 models.0.lr=2e-6"

DTYPES = list(DTYPES_REGISTRY)
"""Weight dtypes a model can be evaluated or exported in: those of ``models.I.dtype``."""
BENCHMARKS = ("math500", "aime24", "aime25", "amc23", "minerva")
"""Short names accepted by ``graft eval --data``; resolved to ``DATA_DIR/NAME.jsonl``."""
DATA_DIR_ENV = "GRAFT_DATA_DIR"
"""Environment variable naming the folder of the benchmark files when ``graft eval --data-dir`` is not given."""
EVAL_MAX_NEW_TOKENS = 2048
"""``graft eval``'s response limit when neither ``--max-new-tokens`` nor the run gives one, as its help states it
(the value used is :data:`graft.evaluation.evaluate.DEFAULT_MAX_NEW_TOKENS`; a test keeps the two equal)."""
SAMPLE_SOURCES = ("train", "peer", "eval")
"""What ``graft samples --from`` reads: own rollouts, admitted peer responses, held-out responses."""
SAMPLE_REWARDS = ("both", "1", "0", "any")
"""``graft samples --reward`` choices."""


def train_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="graft train",
        description="Train models with GRAFT (or GRPO).",
        epilog="Every config key with its resolved value, default and description: graft config show CONFIG [key=value ...]",
    )
    p.add_argument("config", help=CONFIG_HELP)
    p.add_argument("overrides", nargs="*", help=OVERRIDES_HELP)
    return p


def config_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="graft config", description="Inspect a configuration.")
    sub = p.add_subparsers(dest="action", required=True)
    show = sub.add_parser(
        "show",
        help="print the fully resolved config: every key with its value, default, type and description",
        epilog="A * before a key marks a value that differs from the field's default.",
    )
    show.add_argument("config", help=CONFIG_HELP)
    show.add_argument("overrides", nargs="*", help="key=value overrides, as graft train takes them")
    return p


def sweep_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="graft sweep", description="Run a grid of configurations one after another.")
    p.add_argument("config", help=CONFIG_HELP)
    p.add_argument("--grid", action="append", default=[], help="key=v1,v2,... (repeatable; the product is run)")
    p.add_argument("--print", action="store_true", help="print the commands (for a cluster scheduler) instead of running")
    p.add_argument("overrides", nargs="*")
    return p


def eval_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="graft eval", description="pass@k of a model or checkpoint (spec §5 protocol).")
    _add_eval_model_args(ap)
    _add_eval_protocol_args(ap)
    _add_eval_backend_args(ap)
    _add_eval_grading_args(ap)
    return ap


def _add_eval_model_args(ap: argparse.ArgumentParser) -> None:
    """``graft eval``'s model arguments and prompt format."""
    ap.add_argument(
        "--model",
        default=None,
        help="hub id, local HF folder, .gguf, embedded:NAME, or RUN/checkpoints/step_N/MODEL; with --config "
        "also best (default: the best-evaluated checkpoint of the run, else its latest), latest, or "
        "base (the run's starting weights)",
    )
    ap.add_argument(
        "--compare",
        default=None,
        metavar="MODEL",
        help="evaluate this model too (same forms as --model, e.g. base) and print both side by side",
    )
    ap.add_argument(
        "--template",
        choices=["chat", "plain", "fewshot"],
        default=None,
        help="prompt format (default: the run's / checkpoint's, else chat)",
    )
    ap.add_argument(
        "--config",
        default=None,
        help="RUN_DIR/config.yaml of a graft run: evaluate in that run's prompt format (template, worked "
        "examples, instruction, stop strings), tokenizer, dtype and max_new_tokens; --model may then "
        "be the base model, an exported folder or a checkpoint folder",
    )
    ap.add_argument("--model-name", default=None, help="which model of --config (default: its only one)")
    ap.add_argument("--fewshot", type=int, default=None, help="worked examples before the problem (overrides the run's)")
    ap.add_argument(
        "--stop",
        action="append",
        default=None,
        help="stop string (repeatable; \\n and \\t are a newline and a tab; --stop '' for none)",
    )
    ap.add_argument("--instruction", default=None, help="sentence appended to every problem (overrides the run's)")


def _add_eval_protocol_args(ap: argparse.ArgumentParser) -> None:
    """``graft eval``'s data sets, sampling protocol (n, repeats, temperature, top-p, response limit) and output folder."""
    ap.add_argument(
        "--data",
        action="append",
        default=None,
        help="NAME=PATH (jsonl/parquet/hub:NAME[:split]/arithmetic) or one of "
        + ", ".join(BENCHMARKS)
        + " (default with --config: the run's data.val, as 'val', limited to its data.val_limit)",
    )
    ap.add_argument(
        "--data-dir",
        default=None,
        help=f"folder of the benchmark files (default: ${DATA_DIR_ENV}, else ../shared/data from the "
        "working directory or beside the source checkout)",
    )
    ap.add_argument("--n", type=int, default=EvalConfig.n, help="samples per prompt")
    ap.add_argument("--repeats", type=int, default=5, help="independent repeats (mean ± std)")
    ap.add_argument("--temperature", type=float, default=EvalConfig.temperature)
    ap.add_argument("--top-p", type=float, default=EvalConfig.top_p)
    ap.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help=f"default: the run's eval/rollout limit (--config or checkpoint), else {EVAL_MAX_NEW_TOKENS}",
    )
    ap.add_argument("--limit", type=int, default=None, help="only the first N prompts of each dataset")
    ap.add_argument(
        "--out",
        default=None,
        help="output folder (default runs/eval/MODEL; with --compare one subfolder per model, named as in the table)",
    )


def _add_eval_backend_args(ap: argparse.ArgumentParser) -> None:
    """``graft eval``'s sampler: engine, seed, batch size, device and dtype."""
    ap.add_argument(
        "--backend",
        choices=list(ENGINES),
        default="hf",
        help="hf: graft's sampler; hf-bf16: the same over a bf16 copy (~2x faster on CPUs with bf16 matmuls); vllm: GPU",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=64, help="sequences per generate call (hf)")
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda")
    ap.add_argument("--dtype", choices=DTYPES, default=None)


def _add_eval_grading_args(ap: argparse.ArgumentParser) -> None:
    """``graft eval``'s grading and progress arguments."""
    ap.add_argument("--verify-timeout", type=float, default=5.0, help="seconds per grading")
    ap.add_argument("--verify-workers", type=int, default=2)
    ap.add_argument(
        "--domain",
        choices=list(DOMAINS),
        default=None,
        help="how responses are graded (reward.domain): math (math_verify equivalence), number (the box "
        "must hold a number written out), code (unit tests in a sandbox); default: the run's with "
        "--config, else math",
    )
    ap.add_argument(
        "--answer-form", choices=["any", "number"], default=None, help="earlier name of --domain: any is math, number is number"
    )
    ap.add_argument("--on-bad-row", choices=["error", "skip"], default="error")
    ap.add_argument(
        "--no-progress", action="store_true", help="no progress bars, not even on a terminal (off one there are none)"
    )


def grade_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="graft grade",
        description="Grade responses against a config's data with its "
        "domain (or its reward functions) and print each reward with the reward monitor's flags.",
    )
    p.add_argument(
        "config", help="YAML config file (its data, reward.domain and reward.function are used), or the name of a packaged one"
    )
    p.add_argument("overrides", nargs="*", help="key=value overrides, as graft train takes them")
    p.add_argument("--responses", required=True, help='JSONL rows {"id": ..., "response": "..."}')
    p.add_argument("--data", help="the data file the ids refer to (default: the config's data.train and data.val)")
    p.add_argument("--json", action="store_true", help="one JSON line per response instead of text")
    return p


def probe_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="graft probe",
        description="Step-0 probe: solve rates, complementarity, "
        "compatibility s and the predicted exchange per step of a config's models.",
    )
    p.add_argument("config", help=CONFIG_HELP)
    p.add_argument("--prompts", type=int, default=64, help="how many training prompts to probe")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument(
        "--samples",
        metavar="FILE",
        help="write every graded response (model, prompt id, reward, status, text) here as JSON lines, to read them",
    )
    p.add_argument(
        "--compat",
        action="store_true",
        help="also score every response under the other model(s) (s), which the predicted admitted counts need",
    )
    p.add_argument(
        "--checkpoint",
        default=None,
        metavar="STEP_DIR",
        help="load every model's weights from this checkpoint (RUN/checkpoints/step_N)",
    )
    p.add_argument(
        "--resamples", type=int, default=8, help="seeded shuffles of the probed prompts, each cut into batches of batch_prompts"
    )
    p.add_argument(
        "--batch-prompts",
        type=int,
        nargs="+",
        default=None,
        metavar="N",
        help="also predict the exchange at these prompts per step (default: the config's batch_prompts)",
    )
    p.add_argument("overrides", nargs="*")
    return p


def export_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="graft export",
        description="Write one model of a checkpoint as a plain "
        "Hugging Face folder (safetensors, tokenizer, generation config, model card).",
    )
    p.add_argument("run_dir", help="the run folder (holding checkpoints/)")
    p.add_argument("out", help="output folder (must not exist or be empty)")
    p.add_argument(
        "--step",
        default=None,
        help="step number, 'latest' (default) or 'best' (highest in-training validation pass@1 of the model)",
    )
    p.add_argument("--model", default=None, help="model name in the run (default: the only one)")
    p.add_argument("--dtype", choices=DTYPES, default=None, help="weights dtype (default: the training dtype)")
    return p


def analyze_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="graft analyze", description="Complementarity, exchange, s and clip statistics of a run.")
    ap.add_argument("run_dir")
    ap.add_argument("--against", default=None, help="another run folder: complementarity across the two runs' stores")
    ap.add_argument("--json", action="store_true", help="print the analysis JSON instead of the summary")
    return ap


def samples_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="graft samples",
        description="Print a seeded random pick of a run's responses "
        "(training rollouts, half rewarded and half not, by default): read what the model writes.",
    )
    p.add_argument("run", help="a run folder (or a `graft eval` output folder with --from eval)")
    p.add_argument(
        "--from",
        dest="source",
        choices=SAMPLE_SOURCES,
        default="train",
        help="train: own rollouts; peer: rollouts admitted from another model; eval: held-out responses",
    )
    p.add_argument("--model", help="train/eval: the writer; peer: the receiver (default: every model)")
    p.add_argument(
        "--reward",
        choices=SAMPLE_REWARDS,
        default="both",
        help="both: half rewarded, half not (default); 1: rewarded only; 0: not rewarded only; any: drawn from all alike",
    )
    p.add_argument("--steps", help="training steps, e.g. 13-18 (default: all)")
    p.add_argument("-n", type=int, default=12, help="how many to print (default 12)")
    p.add_argument("--seed", type=int, default=0, help="the draw's seed (default 0)")
    p.add_argument("--width", type=int, default=400, help="cut each question and response at this many characters")
    p.add_argument(
        "--data", action="append", default=[], help="eval JSONL joined by id for the question text (repeatable; --from eval)"
    )
    p.add_argument("--json", action="store_true", help="print the picked samples as JSON lines")
    return p


def report_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="graft report", description="Markdown report with plots for one or more runs.")
    ap.add_argument("run_dirs", nargs="+")
    ap.add_argument("--out", default=None, help="output folder (default: RUN_DIR/report for one run, ./report otherwise)")
    return ap


def store_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="graft store", description="Inspect a graft trajectory store.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_info = sub.add_parser("info", help="print models, steps, rows, reward rate and size")
    p_info.add_argument("path", help="store folder (or a run folder holding trajectories/)")
    p_info.add_argument("--json", action="store_true", help="print the summary as JSON")
    p_exp = sub.add_parser("export", help="write every row as JSON lines")
    p_exp.add_argument("path", help="store folder (or a run folder holding trajectories/)")
    p_exp.add_argument("out", help="output .jsonl file")
    p_exp.add_argument("--model", action="append", help="only this model's rows (repeatable)")
    return parser


def experiment_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="graft experiment",
        description="``graft experiment``: a seeded comparison of "
        "arms (GRPO, GRAFT, ablations, stored peers), run resumably one training run at a "
        "time, each final checkpoint evaluated, everything summarised.",
    )
    ap.add_argument("action", choices=["run", "summarize", "print", "status"])
    ap.add_argument("plan")
    ap.add_argument("--max-minutes", type=float, default=None, help="start no new run after this many minutes")
    ap.add_argument("--only", nargs="*", default=None, help="arms to run (default: all)")
    return ap


def onestep_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="graft onestep",
        description="``graft onestep``: does a peer group on an "
        "all-fail prompt teach the receiver that prompt, and does it transfer?",
    )
    ap.add_argument("config", nargs="?", help="the config whose GRPO trajectories are trained (not with --from)")
    ap.add_argument("overrides", nargs="*", help="key=value config overrides (the study's regime)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1])
    ap.add_argument(
        "--from",
        dest="from_runs",
        nargs="+",
        default=None,
        metavar="RUN_DIR",
        help="measure along these finished GRPO runs (their checkpoints) instead of training trajectories",
    )
    ap.add_argument("--at", type=int, nargs="+", required=True, help="training steps at which to measure (1 = base weights)")
    ap.add_argument("--samples", type=int, default=16, help="samples per prompt and arm (>= 16)")
    ap.add_argument("--unseen", type=int, default=4, help="unseen prompts of the same family per replaced prompt")
    ap.add_argument("--out", required=True)
    return ap


def splits_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="graft splits",
        description="Held-out evaluation splits of a config's procedural "
        "task, disjoint from its training prompts and from each other.",
    )
    ap.add_argument("config", help=CONFIG_HELP)
    ap.add_argument("--out", required=True, help="the folder test.jsonl and test_hard.jsonl are written to")
    ap.add_argument("--test", type=int, default=64, help="prompts in test.jsonl")
    ap.add_argument("--hard", type=int, default=64, help="prompts in test_hard.jsonl")
    ap.add_argument("--hard-scale", type=int, default=3, help="operand range multiplier of the hard split")
    ap.add_argument("--seed", type=int, default=777, help="seed of the test splits (the training task's is data.arithmetic.seed)")
    ap.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="JSONL",
        help="an earlier split whose problems the new ones must not repeat (besides the training "
        "prompts); repeat the option for several",
    )
    ap.add_argument("overrides", nargs="*", help=OVERRIDES_HELP)
    return ap
