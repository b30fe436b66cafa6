"""``graft export``: one model of a checkpoint as a plain Hugging Face folder a user can ship.

    graft export RUN_DIR [--step N|latest|best] [--model NAME] OUT [--dtype bfloat16]

``OUT`` gets ``model.safetensors`` (sharded for large models), ``config.json`` with the real
architecture and the exported dtype, ``generation_config.json`` (EOS ids = every token graft's
sampler stopped at: the tokenizer's EOS plus the base model's generation EOS ids), the
tokenizer files (with its chat template), and a ``README.md`` model card: base model, method
(GRAFT / GRPO / stored peer) and update rule, the key config values, steps trained, the
prompt format (template, worked examples, instruction, stop strings and an example prompt)
and the in-training evaluation results when the run has them. The folder loads with
``AutoModelForCausalLM.from_pretrained(OUT)``; it is the layout vLLM loads (``LLM(model=OUT)``),
which was not run here (no GPU).

- ``--step``: default the newest complete checkpoint; ``best`` the saved step with the highest
  in-training ``eval/NAME/val/pass@1`` (ties to the earlier step, :func:`best_checkpoint`),
  read from ``metrics.jsonl`` and the checkpoint's ``eval_history``.
- LoRA checkpoints hold only the adapter; it is merged into the base weights (``cfg.path``,
  which must be reachable) in float32, then cast to the export dtype.
- Weights are loaded in float32 and cast to ``--dtype`` (default: the dtype the model trained
  in), so a float32 export is bit-identical to the checkpoint.
- The checkpoint's files of that model are re-hashed against its manifest first; a changed
  file is an error naming it. ``OUT`` is written to a temporary folder and renamed into place;
  an existing non-empty ``OUT`` is refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

import torch
import transformers
from transformers import GenerationConfig

from graft import __version__
from graft.commands.parsers import export_parser
from graft.config import Config, ModelConfig, load_config
from graft.evaluation.evaluate import eval_history, select_checkpoint
from graft.exchange.kinds import ExchangeDescription, describe_exchange
from graft.policy import prompts
from graft.policy.loading import EMBEDDED_MODELS, EMBEDDED_PREFIX, load_model, load_tokenizer, looks_like_hub_id
from graft.registry import DTYPES, RULES
from graft.storage.checkpoint import CheckpointError, list_checkpoints, load_checkpoint, verify_model_files

CARD_EXCHANGE_SETTINGS = ("delta", "balance", "weighting", "admission")
"""Exchange settings the model card's table shows (when the run exchanged)."""


def _model_cfg(run_cfg: Config, name: str | None, available: Sequence[str], where: Path) -> ModelConfig:
    names = [m.name for m in run_cfg.models if m.name in available]
    if name is None:
        if len(names) != 1:
            raise CheckpointError(f"{where} holds models {', '.join(names)}; choose one with --model")
        name = names[0]
    match = [m for m in run_cfg.models if m.name == name]
    if not match or name not in available:
        raise CheckpointError(f"{where} has no model {name!r}; it holds: {', '.join(names) or 'none'}")
    return match[0]


# ----------------------------------------------------------------------------- the model card


def _is_hub_id(path: str) -> bool:
    return "/" in path and looks_like_hub_id(path) and not Path(path).exists()


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return "none" if v is None else str(v)


def upstream(path: str) -> dict | None:
    """``{"upstream": hub id, "license": ..., "license_url": ...}`` of an embedded model path, else ``None``."""
    return EMBEDDED_MODELS.get(path[len(EMBEDDED_PREFIX) :]) if path.startswith(EMBEDDED_PREFIX) else None


_REPO = Path(__file__).resolve().parents[2]
"""The folder holding the ``graft`` package (a git checkout's root when graft runs from one)."""


def provenance(repo: Path = _REPO) -> dict:
    """Versions of torch, transformers and graft, and graft's git commit (``None`` outside a git checkout)."""

    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--show-toplevel", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        out = []
    # graft's own checkout only (an installed copy may sit inside some other repository)
    commit = out[1] if len(out) == 2 and Path(out[0]).resolve() == repo.resolve() else None
    return {"torch": torch.__version__, "transformers": transformers.__version__, "graft": __version__, "graft_commit": commit}


def model_card(
    run_cfg: Config,
    mcfg: ModelConfig,
    step: int,
    source: Path,
    dtype: str,
    history: list[dict],
    example_prompt: str | None,
    versions: dict | None = None,
) -> str:
    """README.md of an exported model (pure: everything comes from the arguments; ``versions`` is
    :func:`provenance`)."""
    desc = describe_exchange(run_cfg)
    lines = _card_header(mcfg, step, desc.method)
    lines += [
        f"Exported by `graft export` from `{source}` (model `{mcfg.name}`, step {step} of {run_cfg.steps} "
        f"configured), as `{dtype}` weights" + (" with the LoRA adapter merged into the base." if mcfg.lora.enabled else "."),
        "",
        "## Training",
        "",
    ]
    lines += _card_training(run_cfg, mcfg, step, desc)
    lines += _card_prompt_format(mcfg, example_prompt)
    lines += _card_evaluation(run_cfg, mcfg, step, history)
    lines += _card_provenance(versions)
    lines += [
        "",
        "## Loading",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        'model = AutoModelForCausalLM.from_pretrained("PATH")',
        'tokenizer = AutoTokenizer.from_pretrained("PATH")',
        "```",
        "",
        'vLLM: `LLM(model="PATH")` with `SamplingParams(stop=[...])` set to the stop strings above '
        "(a plain Hugging Face folder; not run by graft's tests).",
        "",
    ]
    return "\n".join(lines)


def _card_header(mcfg: ModelConfig, step: int, method: str) -> list[str]:
    up_info = upstream(mcfg.path)
    lines = ["---", "library_name: transformers"]
    if up_info is not None:
        lines.append(f"base_model: {up_info['upstream']}")
    elif _is_hub_id(mcfg.path):
        lines.append(f"base_model: {mcfg.path}")
    return lines + ["tags:", "- graft", "- grpo", "- rlvr", "---", "", f"# {mcfg.name} after {step} steps of {method}", ""]


def _card_training(run_cfg: Config, mcfg: ModelConfig, step: int, desc: ExchangeDescription) -> list[str]:
    """The base model, the method (the run's exchange, as :func:`describe_exchange` states it) and the settings."""
    up, ro, up_info = run_cfg.update, run_cfg.rollout, upstream(mcfg.path)
    partners = [f"`{m.name}` (`{m.path}`)" for m in run_cfg.models if m.name != mcfg.name]
    lines = [
        f"- Base model: `{mcfg.path}`"
        + (f" (tokenizer `{mcfg.tokenizer}`)" if mcfg.tokenizer else "")
        + (
            f", graft's embedded GGUF quantisation of [`{up_info['upstream']}`](https://huggingface.co/{up_info['upstream']})"
            if up_info
            else ""
        ),
        *(
            [f"- Licence of the base model: {up_info['license']} ({up_info['license_url']}); this derivative is subject to it"]
            if up_info
            else []
        ),
        f"- Method: {desc.method} — {desc.summary}" + (f"; co-trained with {', '.join(partners)}" if partners else ""),
        *[
            f"- `{k}` = {_fmt(v)} in force (configured {_fmt(c)}: overridden by {desc.kind})"
            for k, (c, v) in desc.replaced.items()
        ],
        f"- Update rule: `{up.rule}` — {RULES[up.rule].summary}",
        f"- Steps trained: {step} × {run_cfg.batch_prompts} prompts × {ro.n} samples (data: `{run_cfg.data.train}`)",
        "",
        "| setting | value |",
        "|---|---|",
    ]
    rows = [
        ("lr", mcfg.lr),
        ("trained dtype", mcfg.dtype),
        ("LoRA", f"r={mcfg.lora.r}, alpha={mcfg.lora.alpha}, merged" if mcfg.lora.enabled else "no (full fine-tuning)"),
        ("rollout.n / temperature / top_p", f"{ro.n} / {_fmt(ro.temperature)} / {_fmt(ro.top_p)}"),
        ("rollout.max_new_tokens", ro.max_new_tokens),
        ("batch_prompts", run_cfg.batch_prompts),
        ("update.clip_low / clip_high", f"{_fmt(up.clip_low)} / {_fmt(up.clip_high)}"),
        ("update.loss_agg", desc.settings["update.loss_agg"]),
        ("update.num_minibatches", up.num_minibatches),
    ]
    rows += [(k, v) for k, v in desc.settings.items() if k.split(".")[-1] in CARD_EXCHANGE_SETTINGS]
    rows.append(("seed", run_cfg.seed))
    return lines + [f"| {k} | {_fmt(v)} |" for k, v in rows]


def _card_prompt_format(mcfg: ModelConfig, example_prompt: str | None) -> list[str]:
    stops = mcfg.stop_strings()
    lines = [
        "",
        "## Prompt format",
        "",
        f"Use the prompt the model trained with (`graft eval --config RUN/config.yaml --model-name {mcfg.name}` does):",
        "",
        f"- task domain `{mcfg.domain_name}`, template `{mcfg.template}`, {mcfg.num_shots()} worked example(s) "
        f"of that domain, instruction {json.dumps(prompts.instruction_of(mcfg))}",
        f"- stop strings: {', '.join(json.dumps(s) for s in stops) if stops else 'none (the model ends with EOS)'}",
    ]
    if example_prompt is not None:
        lines += ["", "Example (problem `What is 2 + 3?`):", "", "```text", example_prompt, "```"]
    return lines


def _card_evaluation(run_cfg: Config, mcfg: ModelConfig, step: int, history: list[dict]) -> list[str]:
    key = f"eval/{mcfg.name}/val/pass@1"
    evals = [(r["step"], r[key]) for r in history if r.get(key) is not None]
    lines = ["", "## Evaluation", ""]
    if not evals:
        return lines + ["No in-training evaluation was recorded for this run."]
    lines += [
        f"In-training validation pass@1 (`data.val` = `{run_cfg.data.val}`, {run_cfg.eval.n} samples per prompt, "
        f"temperature {_fmt(run_cfg.eval.temperature)}, top-p {_fmt(run_cfg.eval.top_p)}):",
        "",
        "| step | pass@1 (%) |",
        "|---:|---:|",
    ]
    return lines + [f"| {s}{' (exported)' if s == step else ''} | {100 * v:.2f} |" for s, v in evals]


def _card_provenance(versions: dict | None) -> list[str]:
    if versions is None:
        return []
    return [
        "",
        "## Provenance",
        "",
        f"- graft {versions['graft']} (git commit `{versions['graft_commit']}`)"
        if versions.get("graft_commit")
        else f"- graft {versions['graft']} (git commit: None, not a git checkout)",
        f"- torch {versions['torch']}, transformers {versions['transformers']}",
    ]


# ----------------------------------------------------------------------------- export


def export(
    run_dir: str | Path, out: str | Path, step: str | int | None = None, model: str | None = None, dtype: str | None = None
) -> Path:
    """Write model ``model`` of checkpoint ``step`` of ``run_dir`` to ``out``; returns ``out``."""

    run_dir, out = Path(run_dir), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"{out} already exists and is not empty; choose another output folder")
    if dtype is not None and dtype not in DTYPES:
        raise CheckpointError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if model is None and run_dir.is_dir() and (run_dir / "config.yaml").is_file():
        names = [m.name for m in load_config(run_dir / "config.yaml").models]
        model = names[0] if len(names) == 1 else None
    if model is None:
        raise CheckpointError(f"{run_dir}: choose the model to export with --model NAME")
    path = select_checkpoint(run_dir, step, model)
    ckpt = load_checkpoint(path)
    run_cfg = load_config(path / "config.yaml")
    mcfg = _model_cfg(run_cfg, model, list(ckpt.model_dirs), path)
    folder = ckpt.model_dirs[mcfg.name]
    verify_model_files(folder)  # sha256 of the weights and tokenizer files
    target = dtype or mcfg.dtype
    # float32 load (a bf16 checkpoint upcasts exactly), LoRA merged (lora.enabled off + an adapter folder)
    load_cfg = dataclasses.replace(mcfg, dtype="float32", lora=dataclasses.replace(mcfg.lora, enabled=False))
    net = load_model(load_cfg, device="cpu", weights_from=str(folder)).to(DTYPES[target])
    tok = load_tokenizer(mcfg, weights_from=str(folder))
    gen = getattr(net, "generation_config", None) or GenerationConfig.from_model_config(net.config)
    eos = gen.eos_token_id if isinstance(gen.eos_token_id, (list, tuple)) else [gen.eos_token_id]
    stop_ids = sorted({int(i) for i in [*eos, tok.eos_token_id] if i is not None})  # what graft's sampler stops at
    gen.eos_token_id = stop_ids[0] if len(stop_ids) == 1 else stop_ids
    if gen.pad_token_id is None:
        gen.pad_token_id = tok.pad_token_id
    net.generation_config = gen
    try:
        example = prompts.render_prompt(mcfg, tok, "What is 2 + 3?")
    except Exception:  # noqa: BLE001 - the card is still useful without an example
        example = None
    card = model_card(
        run_cfg, mcfg, ckpt.step, path, target, eval_history(run_dir, list_checkpoints(run_dir)), example, provenance()
    )

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-export-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        net.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        (tmp / "README.md").write_text(card)
        cfg_file = tmp / "config.json"  # defensive: an FSDP class name must never reach a shipped folder
        data = json.loads(cfg_file.read_text())
        data["architectures"] = [a[4:] if a.startswith("FSDP") else a for a in data.get("architectures") or []]
        cfg_file.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def export_main(argv: Sequence[str] | None = None) -> int:
    args = export_parser().parse_intermixed_args(argv)
    out = export(args.run_dir, args.out, args.step, args.model, args.dtype)
    print(f"exported to {out} (model card: {out / 'README.md'})")
    return 0
