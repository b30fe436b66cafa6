"""``graft eval``: which model, which data, which sampler -- then :func:`graft.evaluation.evaluate.evaluate`.

The command line of evaluation: resolving ``--model`` / ``--config`` / ``--model-name`` (a hub id, a folder, a run's
best, latest or base model), the datasets (``--data``, the shared benchmarks, the run's ``data.val``), the sampler
(``--backend``: an in-memory Policy through a rollout engine, or vLLM serving a folder), and the tables it prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Sequence

import torch
from transformers import AutoConfig

from graft.commands.parsers import BENCHMARKS, DATA_DIR_ENV, eval_parser
from graft.config import ConfigError, ModelConfig, RewardConfig, load_config
from graft.config.upgrade import ANSWER_FORMS
from graft.console import bars, quiet_bars
from graft.data.datasets import load_prompts
from graft.domains.grading import make_grader, reference_of
from graft.evaluation.evaluate import (
    DEFAULT_MAX_NEW_TOKENS,
    EvalError,
    check_name,
    evaluate,
    mean_pm,
    pct,
    select_checkpoint,
)
from graft.policy.codec import TextCodec
from graft.policy.context import check_context, max_positions
from graft.policy.engines import EngineUnavailable, Sampler, VllmEngine, make_engine
from graft.policy.policy import Policy
from graft.policy.prompts import check_conversations
from graft.policy.sampling import SamplingParams
from graft.storage.checkpoint import (
    CheckpointError,
    checkpoint_step,
    latest_checkpoint,
    list_checkpoints,
    reading,
    verify_model_files,
)
from graft.storage.lock import FolderLock
from graft.types import Prompt


def vllm_model_path(cfg, weights_from: str | None) -> str:
    """The folder (or hub id) vLLM should load for a model config / checkpoint, or an EvalError why none."""
    if weights_from is not None:
        if (Path(weights_from) / "adapter_config.json").is_file():
            raise EvalError(
                f"backend vllm: {weights_from} holds a LoRA adapter, not a full model; use --backend hf (it merges the adapter)"
            )
        return str(weights_from)
    return str(cfg.path)


def engine_sampler(backend: str, cfg: ModelConfig, weights_from: str | None, device: str) -> tuple[Sampler, int | None]:
    """The sampler ``graft eval --backend`` uses for model ``cfg`` (weights from ``weights_from`` when given), and the
    model's ``max_position_embeddings``: an in-memory Policy through the ``backend`` rollout engine, or vLLM serving
    the model folder (graft renders, tokenizes, decodes and cuts with the model's codec)."""
    try:
        if backend == "vllm":
            folder = vllm_model_path(cfg, weights_from)
            VllmEngine.available(folder)  # before the tokenizer loads
            return VllmEngine(None, folder=folder, codec=TextCodec.load(cfg, weights_from)), _folder_max_positions(folder)
        policy = Policy.load(cfg, device=device, weights_from=weights_from)
        return make_engine(backend, policy), max_positions(policy.model.config)
    except EngineUnavailable as e:
        raise EvalError(f"backend {backend}: {e}") from None


def _folder_max_positions(folder: str) -> int | None:
    try:
        return max_positions(AutoConfig.from_pretrained(folder))
    except (OSError, ValueError):
        return None


def data_dir_candidates() -> list[Path]:
    """Where the benchmark files are looked for without ``--data-dir`` or :data:`DATA_DIR_ENV`, in order:
    ``../shared/data`` from the working directory, then beside the source checkout graft runs from (none for an
    installed package)."""
    candidates = [Path.cwd().parent / "shared" / "data"]
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").is_file():
        candidates.append(repo.parent / "shared" / "data")
    return candidates


def default_data_dir() -> Path | None:
    """:data:`DATA_DIR_ENV` when set, else the first of :func:`data_dir_candidates` that is a folder."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env)
    return next((c for c in data_dir_candidates() if c.is_dir()), None)


def _no_data_dir(item: str) -> EvalError:
    tried = ", ".join(str(c) for c in dict.fromkeys(data_dir_candidates()))
    return EvalError(
        f"--data {item}: no data folder found (tried {tried}); pass --data-dir DIR or set "
        f"{DATA_DIR_ENV} (the folder holding {item}.jsonl)"
    )


def parse_data_args(specs: Sequence[str], data_dir: Path | None) -> dict[str, str]:
    """``NAME=SPEC`` / benchmark short name / bare path -> {name: loader spec}."""
    out: dict[str, str] = {}
    for item in specs:
        if "=" in item and not item.startswith("hub:"):
            name, spec = item.split("=", 1)
        elif item in BENCHMARKS:
            if data_dir is None:
                raise _no_data_dir(item)
            name, spec = item, str(Path(data_dir) / f"{item}.jsonl")
            if not Path(spec).exists():
                raise EvalError(f"--data {item}: {spec} does not exist")
        else:
            spec = item
            name = "arithmetic" if item == "arithmetic" else re.sub(r"[^A-Za-z0-9_.\-]", "_", Path(item.split(":")[-1]).stem)
        check_name(name)
        if name in out:
            raise EvalError(f"--data: dataset name {name!r} given twice")
        out[name] = spec
    return out


def _unescape(text: str) -> str:
    """``\\n``, ``\\t`` and ``\\\\`` in a command-line stop string become a newline, a tab and a backslash."""
    return re.sub(r"\\(n|t|\\)", lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m.group(1)], text)


def _run_config(config: str):

    p = Path(config)
    if p.is_dir():
        p = p / "config.yaml"
    if not p.is_file():
        raise ConfigError(f"--config: {p} not found (pass RUN_DIR/config.yaml of a graft run)")
    return load_config(p)


RUN_MODELS = ("best", "latest", "base")
"""``--model`` keywords with ``--config``: the model's best-evaluated (else latest) or latest checkpoint of the run,
or the run's starting weights."""


def run_folder(config: str, run_cfg) -> Path:
    """The run a ``--config`` names: the folder holding that config.yaml when it holds checkpoints, else the
    config's ``run_dir``."""
    p = Path(config)
    folder = p if p.is_dir() else p.parent
    return folder if (folder / "checkpoints").is_dir() else Path(run_cfg.run_dir)


def run_model(
    config: str, model_name: str | None, which: str | None, held: contextlib.ExitStack | None = None
) -> tuple[str, str]:
    """``(--model value, label)`` for a ``--config`` run and a :data:`RUN_MODELS` keyword (None: ``best``):
    the checkpoint folder ``RUN/checkpoints/step_N/NAME`` of the model's best-evaluated step (highest in-training
    ``eval/NAME/val/pass@1``; the latest checkpoint when the run has no such value; :func:`select_checkpoint`)
    or its latest step, or the run's starting weights (``models.i.path``) for ``base``. With ``held``, the chosen
    checkpoint is held there (:func:`~graft.storage.checkpoint.reading`: a run still training does not prune it
    while it is evaluated), chosen again when pruned before it could be held."""

    run_cfg = _run_config(config)
    base = _pick_model(run_cfg, config, model_name)
    run_dir = run_folder(config, run_cfg)
    which = which or "best"
    if which == "base":
        return base.path, f"{run_dir.name}-{base.name}-base"
    if not list_checkpoints(run_dir):
        raise EvalError(
            f"--config {config}: the run {run_dir} has no complete checkpoint; pass --model base for the "
            "starting weights, or a model folder"
        )
    for attempt in range(3):
        try:
            step_dir = select_checkpoint(run_dir, which, base.name)
        except CheckpointError:  # no in-training evaluation: the latest checkpoint is the best we know
            step_dir = select_checkpoint(run_dir, "latest", base.name)
        try:
            if held is not None:
                held.enter_context(reading(step_dir))
            break
        except CheckpointError:  # pruned between the choice and the hold: choose again
            if attempt == 2:
                raise
    if not (step_dir / base.name).is_dir():
        raise EvalError(f"{step_dir} holds no folder of model {base.name}")
    return str(step_dir / base.name), f"{run_dir.name}-{base.name}-step{checkpoint_step(step_dir)}"


def _pick_model(run_cfg, config: str, model_name: str | None):
    """The ModelConfig ``--model-name`` names in the run config ``config`` (its only model when not given)."""

    names = [m.name for m in run_cfg.models]
    if model_name is None and len(names) != 1:
        raise ConfigError(f"--config {config} has models {', '.join(names)}; choose one with --model-name")
    name = model_name or names[0]
    if name not in names:
        raise ConfigError(f"--model-name {name!r} is not a model of {config} (models: {', '.join(names)})")
    return run_cfg.models[names.index(name)]


def _model_cfg_for(
    model: str,
    template: str | None = None,
    config: str | None = None,
    model_name: str | None = None,
    fewshot: int | None = None,
    stop: Sequence[str] | None = None,
    instruction: str | None = None,
):
    """``(ModelConfig, weights folder or None, run Config or None)`` for ``graft eval --model``.

    The prompt format (template, worked examples, instruction, stop strings), tokenizer and dtype
    come from a run's model config: ``--config RUN/config.yaml --model-name NAME`` (then ``--model``
    may be that model's base, any Hugging Face folder such as a ``graft export``, or a checkpoint
    folder), else the checkpoint's own run when ``--model`` is ``RUN/checkpoints/step_N/NAME``, else
    the ``ModelConfig`` defaults. ``--template/--fewshot/--stop/--instruction`` override it. A
    checkpoint folder (or a LoRA adapter folder) supplies the weights on top of the run's base
    ``path``; LoRA adapters are merged for evaluation. A checkpoint folder's files are verified
    against its manifest (sha256) first.
    """

    p = Path(model)
    if p.is_dir() and (p / "config.yaml").is_file() and not (p / "config.json").is_file():  # a run or step folder
        raise EvalError(_which_model_folder(p, [m.name for m in load_config(p / "config.yaml").models]))
    in_checkpoint = p.is_dir() and (p.parent / "manifest.json").is_file() and (p.parent / "config.yaml").is_file()
    run_cfg, base = None, None
    if config is not None:
        run_cfg = _run_config(config)
        base = _pick_model(run_cfg, config, model_name)
    elif model_name is not None:
        raise ConfigError("--model-name needs --config RUN_DIR/config.yaml (the run whose model it names)")
    elif in_checkpoint:  # RUN/checkpoints/step_N/A: the checkpoint's own run config
        run_cfg = load_config(p.parent / "config.yaml")
        base = next((m for m in run_cfg.models if m.name == p.name), None)
        if base is None:
            run_cfg = None
    if in_checkpoint:
        verify_model_files(p)
    changes: dict[str, Any] = {}
    if base is not None:
        cfg = dataclasses.replace(base, lora=dataclasses.replace(base.lora, enabled=False))  # merged for inference
        if in_checkpoint or (p / "adapter_config.json").is_file():
            weights_from = str(p)  # the run's base path gives the architecture (and the LoRA base)
        else:
            weights_from = None  # the base model itself, an exported folder or a hub id
            if model != base.path:
                changes.update(path=model, revision=None)
    else:
        cfg, weights_from = ModelConfig(name="eval", path=model), None
    if template:
        changes["template"] = template
    if fewshot is not None:
        changes["fewshot"] = fewshot
    if instruction is not None:
        changes["instruction"] = instruction
    if stop is not None:
        changes["stop"] = [_unescape(x) for x in stop if x != ""]  # --stop "" alone: no stop strings
    cfg = dataclasses.replace(cfg, **changes)  # re-validated (e.g. --fewshot with template plain)
    return cfg, weights_from, run_cfg


def _which_model_folder(p: Path, names: list[str]) -> str:
    """The message for ``--model`` naming a run folder or a checkpoint step folder: the model
    folders that exist (of the latest checkpoint for a run folder), or that there is none."""
    step: Path | None
    if (p / "manifest.json").exists() or p.parent.name == "checkpoints":
        step, kind = p, "a checkpoint step folder"
    else:
        step, kind = latest_checkpoint(p), "a run folder"
        if step is None:
            return f"{p} is a run folder without a complete checkpoint (none in {p / 'checkpoints'}); pass a model folder"
    found = [str(step / n) for n in names if (step / n).is_dir()]
    if not found:
        return f"{p} is {kind} but holds no model folder ({', '.join(names)})"
    return f"{p} is {kind}; pass one model folder" + (" of its latest checkpoint" if step != p else "") + ": " + ", ".join(found)


def eval_main(argv: Sequence[str] | None = None) -> int:
    """``graft eval``; returns the exit status."""
    args = eval_parser().parse_args(argv)
    try:
        return _eval_main(args)
    except EvalError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # data / store / config errors carry their own message
        if type(e).__name__ in (
            "DataError",
            "ConfigError",
            "ModelLoadError",
            "GraderError",
            "StoreError",
            "LockError",
            "DomainError",
            "RewardFunctionError",
        ):
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise


def _eval_main(args) -> int:
    if args.config is None and (args.model is None or args.compare is not None or args.data is None):
        raise EvalError(
            "--model and --data are required without --config (--compare needs --config too); "
            "with --config RUN/config.yaml they default to the run's best checkpoint and data.val"
        )
    reward = _eval_reward(args)
    datasets = _datasets(args, reward)
    with contextlib.ExitStack() as held:  # the checkpoints evaluated, held against pruning until done
        runs = ([_resolve(args, args.compare, held)] if args.compare is not None else []) + [_resolve(args, args.model, held)]
        if len(runs) == 2 and runs[0][1] == runs[1][1]:
            raise EvalError(f"--compare {args.compare}: that is the model already evaluated ({runs[0][1]})")
        results = {}
        for model, label in runs:
            out = (
                Path(args.out) / label
                if args.out and len(runs) > 1
                else Path(args.out)
                if args.out
                else Path("runs/eval") / label
            )
            res, cfg = _evaluate_one(args, model, datasets, out, reward)
            print(f"results: {out / 'results.json'}, {out / 'results.md'}; responses under {out}/DATASET/")
            print(summary_table(res, cfg))
            results[label] = res
    if len(results) > 1:
        print("\n" + compare_table(results))
    return 0


def _resolve(args, model: str | None, held: contextlib.ExitStack) -> tuple[str, str]:
    """``(--model value, label)``: a :data:`RUN_MODELS` keyword of the ``--config`` run, or the model as given; a
    checkpoint's model folder is held in ``held`` (:func:`~graft.storage.checkpoint.reading`)."""
    if args.config is not None and (model is None or model in RUN_MODELS):
        return run_model(args.config, args.model_name, model, held)
    assert model is not None, "_eval_main requires --model without --config"
    if (Path(model).parent / "manifest.json").is_file():  # RUN/checkpoints/step_N/NAME
        held.enter_context(reading(Path(model).parent))
    return model, re.sub(r"[^A-Za-z0-9_.\-]", "_", model.strip("/"))


_SKIP_HINT = "pass --on-bad-row skip to skip bad rows"


def _eval_reward(args) -> RewardConfig:
    """How responses are graded: the ``--config`` run's ``reward`` (its domain or its own reward functions), else
    ``math``; ``--domain`` (or the earlier ``--answer-form``) replaces the domain, ``--verify-*`` the limits."""
    run_cfg = _run_config(args.config) if args.config else None
    reward = dataclasses.replace(run_cfg.reward) if run_cfg is not None else RewardConfig()
    domain = args.domain or ANSWER_FORMS.get(args.answer_form or "")
    return dataclasses.replace(reward, domain=domain or reward.domain, timeout_s=args.verify_timeout, workers=args.verify_workers)


def _datasets(args, reward: RewardConfig) -> dict[str, list[Prompt]]:
    """``--data`` sets, else the ``--config`` run's ``data.val`` (as ``val``, limited to ``data.val_limit``), read as
    the run reads them (its ``data.fields``, its domain's references)."""
    run_cfg = _run_config(args.config) if args.config else None
    fields = run_cfg.data.fields if run_cfg is not None else {}
    read = functools.partial(
        load_prompts, on_bad_row=args.on_bad_row, skip_hint=_SKIP_HINT, fields=fields, reference=reference_of(reward)
    )
    if args.data is None:
        assert run_cfg is not None, "_eval_main requires --data without --config"
        if run_cfg.data.val is None:
            raise EvalError(
                f"--config {args.config} has no data.val; name the set to evaluate on with --data "
                f"(NAME=PATH, arithmetic, or one of {', '.join(BENCHMARKS)})"
            )
        return {
            "val": read(
                run_cfg.data.val,
                tasks=run_cfg.data.tasks,
                limit=args.limit or run_cfg.data.val_limit,
            )[0]
        }
    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    return {name: read(spec, limit=args.limit)[0] for name, spec in parse_data_args(args.data, data_dir).items()}


def _evaluate_one(args, model: str, datasets: dict[str, list[Prompt]], out: Path, reward: RewardConfig) -> tuple[dict, Any]:
    """Evaluate one model (``--model`` form) on ``datasets`` into ``out``; ``(results, its ModelConfig)``."""

    cfg, weights_from, run_cfg = _model_cfg_for(
        model, args.template, args.config, args.model_name, args.fewshot, args.stop, args.instruction
    )
    cfg.bind_domain(reward.domain)
    check_conversations([cfg], [p for ps in datasets.values() for p in ps], "--data" if args.data else "data.val")
    if args.dtype:
        cfg.dtype = args.dtype
    run_max = (run_cfg.eval.max_new_tokens or run_cfg.rollout.max_new_tokens) if run_cfg is not None else None
    params = _sampling(args, args.max_new_tokens or run_max or DEFAULT_MAX_NEW_TOKENS)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    with FolderLock(out, "--out folder"):  # one evaluation per output folder, taken before the model loads
        return _evaluate_into(args, model, out, datasets, cfg, weights_from, reward, params, device)


def _evaluate_into(
    args, model: str, out: Path, datasets: dict, cfg, weights_from, reward: RewardConfig, params: SamplingParams, device: str
) -> tuple[dict, Any]:
    if not bars(not args.no_progress):
        quiet_bars()  # the hub's and transformers' weight-loading bars too
    sampler, positions = engine_sampler(args.backend, cfg, weights_from, device)
    check_context(
        cfg.name if args.config else model,
        sampler.codec,
        positions,
        [p for ps in datasets.values() for p in ps],
        params.max_new_tokens,
        "--max-new-tokens",
    )
    with make_grader(reward) as grader:
        res = evaluate(
            sampler,
            datasets,
            grader,
            out,
            params,
            repeats=args.repeats,
            backend=args.backend,
            progress=not args.no_progress,
            model_label=model,
            success_threshold=reward.success_threshold,
        )
    return res, cfg


def _sampling(args, max_new_tokens: int) -> SamplingParams:
    """The sampling protocol of ``graft eval``'s flags (--n, --temperature, --top-p, --seed, --batch-size) with the
    response limit ``max_new_tokens``; a value out of range is an :class:`EvalError` naming it."""
    try:
        return SamplingParams(
            n=args.n,
            max_new_tokens=max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            batch_size=args.batch_size,
            seed=args.seed,
        )
    except ValueError as e:
        raise EvalError(str(e)) from None


def compare_table(results: dict[str, dict]) -> str:
    """Models side by side (``label -> evaluate() results``; the first, ``--compare``, is the reference): per dataset
    pass@1 mean ± std of each, and every other model's difference from the first in points."""
    labels = list(results)
    ref = results[labels[0]]
    head = (
        "| dataset | prompts | "
        + " | ".join(f"{label} pass@1 (%)" for label in labels)
        + "".join(f" | {label} − {labels[0]} (points)" for label in labels[1:])
        + " |"
    )
    lines = [head, "|---|---:|" + "---:|" * (2 * len(labels) - 1)]
    rows: list[tuple[str, Any, tuple[str, ...]]] = [
        (name, d["num_prompts"], ("datasets", name)) for name, d in ref["datasets"].items()
    ]
    if len(ref["datasets"]) > 1:
        rows.append(("macro average", f"{len(ref['datasets'])} sets", ("macro",)))
    for name, n, where in rows:
        get = [functools.reduce(lambda d, k: d[k], where, results[label])["pass@1"] for label in labels]
        cells = [pct(g) for g in get]
        diffs = [f"{100 * (g['mean'] - get[0]['mean']):+.1f}" for g in get[1:]]
        lines.append(f"| {name} | {n} | " + " | ".join(cells + diffs) + " |")
    return "\n".join(lines)


def summary_table(results: dict, cfg=None) -> str:
    """The one-screen table ``graft eval`` ends with: dataset, prompts, pass@1 (%) and the mean reward, each mean ± std
    over repeats, n, repeats (and the prompt format of ``cfg``, a ModelConfig, so a base model and its checkpoint can
    be seen to share it). A success (pass@1) is a reward above ``reward.success_threshold`` (the ``--config`` run's)."""
    proto = results["protocol"]
    lines = [f"model: {proto.get('model')}"]
    if cfg is not None:
        stops = ", ".join(json.dumps(x) for x in cfg.stop_strings()) or "none"
        lines.append(f"prompt: template {cfg.template}, {cfg.num_shots()} worked example(s), stop strings {stops}")
    lines.append(
        f"temperature {proto['temperature']}, top-p {proto['top_p']}, max {proto['max_new_tokens']} new tokens; "
        f"a success is a reward above {proto.get('success_threshold')}"
    )
    lines += ["", "| dataset | prompts | pass@1 (%) | mean reward | n | repeats |", "|---|---:|---:|---:|---:|---:|"]
    for name, d in results["datasets"].items():
        lines.append(
            f"| {name} | {d['num_prompts']} | {pct(d['pass@1'])} | {mean_pm(d['reward_mean'])} | {proto['n']} | {d['repeats']} |"
        )
    if len(results["datasets"]) > 1:
        m = results["macro"]
        lines.append(
            f"| macro average | {len(results['datasets'])} sets | {pct(m['pass@1'])} | {mean_pm(m['reward_mean'])} | "
            f"{proto['n']} | {proto['repeats']} |"
        )
    return "\n".join(lines)
