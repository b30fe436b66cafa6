"""The configs and live Runs that ``graft bench`` and its measurements time, the equal-work helpers (one step
sampled once, every model put back to the same start before each timed update), and the timings of one training
step."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import statistics
from pathlib import Path
from typing import Literal

import torch

from graft.bench.flops import ModelShape, model_shape, phase_rates
from graft.config import CONFIGS, Config, ModelConfig
from graft.policy.loading import load_tokenizer
from graft.trainer import loop
from graft.trainer.backends import close_learners


def default_config_path() -> Path:
    """The packaged ``default`` preset (``configs/default.yaml`` in a checkout links it), also in an installed wheel."""
    return CONFIGS / "default.yaml"


def _slug(path: str) -> str:
    """A model name made from the last part of its path."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(path.split(":")[-1].rstrip("/")).name).strip("-")
    return name or "model"


def model_entry(cfg: Config, path: str) -> ModelConfig:
    """The config's entry for model ``path`` (its name, template, lr ...), or a new one: the chat
    template (2 worked examples) when the tokenizer has one, else the few-shot text template."""
    for m in cfg.models:
        if m.path == path:
            return m
    template: Literal["chat", "fewshot"] = "chat" if getattr(load_tokenizer(path), "chat_template", None) else "fewshot"
    lr = cfg.models[0].lr if cfg.models else ModelConfig.lr
    return ModelConfig(name=_slug(path), path=path, template=template, fewshot=2, lr=lr)


def single_model_config(cfg: Config, entry: ModelConfig, run_dir: Path, **update) -> Config:
    """``cfg`` training ``entry`` alone with GRPO, in-process (``backend: local``)."""
    return dataclasses.replace(
        cfg,
        models=[entry],
        run_dir=str(run_dir),
        backend="local",
        exchange=dataclasses.replace(cfg.exchange, kind="none"),  # GRPO
        update=dataclasses.replace(cfg.update, **update),
    )


def close_run(run) -> None:
    """Stop a Run's grader workers and learners."""
    run.grader.close()
    close_learners(run.learners)


def first_step(run) -> tuple[list, dict]:
    """Step 1 of ``run`` sampled, scored and exchanged once: ``(prompts, train groups per model)``, what an
    equal-work measurement (``graft bench update-precision``) updates on again and again."""
    prompts, _ = run.sampler.next_batch()
    groups, _ = loop.rollout_phase(run, prompts, 1)
    loop.score_phase(run, groups)
    return prompts, loop.exchange_phase(run, groups, 1).train_groups


def snapshot_models(run) -> dict[str, tuple[dict, dict]]:
    """Copies of every model's weights and optimiser state now, for :func:`restore_model`: the equal-work
    benchmarks update from the same start again and again."""
    return {
        name: (
            {k: v.detach().clone() for k, v in learner.workers.worker.policy.model.state_dict().items()},
            copy.deepcopy(learner.optimizer.state_dict()),
        )
        for name, learner in run.learners.items()
    }


def restore_model(run, name: str, snapshot: dict[str, tuple[dict, dict]]) -> None:
    """Model ``name`` of ``run`` back to its weights and optimiser state in ``snapshot`` (:func:`snapshot_models`)."""
    weights, optim = snapshot[name]
    learner = run.learners[name]
    with torch.no_grad():
        learner.workers.worker.policy.model.load_state_dict(weights)
    learner.optimizer.load_state_dict(copy.deepcopy(optim))


def write_results(path: str | None, raw: dict, args, **extra) -> None:
    """A benchmark's raw measurements, its arguments and ``extra`` as JSON at ``path`` (nothing when None)."""
    if path:
        Path(path).write_text(json.dumps({"raw": raw, "args": vars(args), **extra}, indent=2))


def run_shapes(run) -> dict[str, ModelShape]:
    """The FLOP-count sizes of every model of a local Run (:func:`graft.bench.flops.model_shape`)."""
    return {name: model_shape(learner.policy.model) for name, learner in run.learners.items()}


def step_row(metrics: dict, shapes: dict[str, ModelShape]) -> dict:
    """Timings, counts and model GFLOP/s per phase (:func:`graft.bench.flops.phase_rates`) of one
    :func:`graft.trainer.loop.train_step` result of the models ``shapes`` names (summed over them)."""
    names = list(shapes)
    total = lambda key: sum(metrics.get(f"{n}/{key}", 0) or 0 for n in names)  # noqa: E731
    row = {f"{ph}_s": metrics.get(f"time/{ph}_s") for ph in ("step", "rollout", "score", "exchange", "update")}
    row |= {
        "tokens_generated": total("tokens/generated"),
        "tokens_update": total("tokens/update"),
        "reward_mean": statistics.mean(metrics.get(f"{n}/reward/mean", 0.0) for n in names),
        "metrics": metrics,
    }
    return row | phase_rates(metrics, shapes)


def rewound_step(run, state: dict, step: int) -> dict:
    """One :func:`graft.trainer.loop.train_step` on the prompts the sampler gives from ``state``."""
    run.sampler.load_state_dict(json.loads(json.dumps(state)))
    return loop.train_step(run, step)
