"""TRL's side of part (a) of ``graft bench``: a ``GRPOTrainer`` set up as
:mod:`graft.bench.trl_settings` says, timed step by step. Imports TRL: import this module only
when :func:`~graft.bench.trl_settings.trl_unavailable_reason` is None."""

from __future__ import annotations

import dataclasses
import statistics
import time
import warnings
from pathlib import Path
from typing import Callable

from datasets import Dataset
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback
from trl import GRPOConfig, GRPOTrainer

from graft.bench.common import package_version
from graft.bench.trl_settings import TrlUnsupported, trl_config_kwargs
from graft.config import Config, ModelConfig
from graft.policy.loading import load_model, load_tokenizer


class _StepClock(TrainerCallback):
    """The wall clock at the begin and the end of every optimizer step."""

    def __init__(self):
        self.begin: list[float] = []
        self.end: list[float] = []

    def on_step_begin(self, args, state, control, **kw):
        self.begin.append(time.perf_counter())

    def on_step_end(self, args, state, control, **kw):
        self.end.append(time.perf_counter())


def _timed(fn: Callable, sink: list[float]) -> Callable:
    """``fn`` that appends the seconds of every call to ``sink``."""

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - t0)

    return wrapper


class TrlBench:
    """A TRL ``GRPOTrainer`` on a fresh copy of ``entry`` whose :meth:`step` is one generation
    batch of ``prompts`` trained for ``update.num_minibatches`` optimizer steps."""

    def __init__(self, cfg: Config, entry: ModelConfig, prompts, grader, learner, out_dir: Path):
        device = learner.policy.device
        fields = {f.name for f in dataclasses.fields(GRPOConfig)}
        self.config_kwargs = trl_config_kwargs(cfg, entry, out_dir, device.type == "cpu", fields)
        missing = sorted(set(self.config_kwargs) - fields)
        if missing:
            raise TrlUnsupported(
                f"TRL {package_version('trl')} has no GRPOConfig field(s) {', '.join(missing)}; "
                "the bench cannot match graft's settings with it (tested with trl 1.16)"
            )
        tokenizer = load_tokenizer(entry)
        model = load_model(entry, device=str(device))
        texts = [learner.codec.render_prompt(p.problem, p.messages) for p in prompts]
        self.prompt_ids_match = [list(ids) for ids in tokenizer(text=texts)["input_ids"]] == [
            learner.codec.encode_prompt(p.problem, p.messages) for p in prompts
        ]
        self._grader = grader
        self._rewards: list[list[float]] = []
        self._tokens: list[int] = []
        self._clock = _StepClock()
        self._spans: dict[str, list[float]] = {"rollout": [], "score": []}
        self.trainer = self._make_trainer(model, tokenizer, texts, prompts)

    def graft_grader(self, completions, answer, completion_ids=None, **_) -> list[float]:
        """TRL's reward function: graft's grader; records the rewards and completion token counts."""
        rewards, _status = self._grader.grade(list(completions), list(answer))
        self._rewards.append(rewards)
        self._tokens.append(sum(len(c) for c in completion_ids or []))
        return rewards

    def _make_trainer(self, model, tokenizer, texts: list[str], prompts) -> GRPOTrainer:
        """The ``GRPOTrainer`` on the rendered ``texts``, quiet on stdout, with its rollout and scoring timed."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = GRPOTrainer(
                model=model,
                reward_funcs=self.graft_grader,
                processing_class=tokenizer,
                callbacks=[self._clock],
                args=GRPOConfig(**self.config_kwargs),
                train_dataset=Dataset.from_list([{"prompt": t, "answer": p.answer} for t, p in zip(texts, prompts, strict=True)]),
            )
        trainer.remove_callback(PrinterCallback)  # it prints the end-of-train metrics on stdout
        for phase, method in (("rollout", "_generate"), ("score", "_calculate_rewards")):
            if hasattr(trainer, method):
                setattr(trainer, method, _timed(getattr(trainer, method), self._spans[phase]))
        return trainer

    def step(self) -> dict:
        """One ``trainer.train()`` call: its step, rollout, scoring and update seconds, and counts."""
        for sink in (
            self._clock.begin,
            self._clock.end,
            self._spans["rollout"],
            self._spans["score"],
            self._rewards,
            self._tokens,
        ):
            sink.clear()
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.trainer.train()
        call = time.perf_counter() - t0
        step = self._clock.end[-1] - self._clock.begin[0]
        rollout = sum(self._spans["rollout"]) if self._spans["rollout"] else None
        score = sum(self._spans["score"]) if self._spans["score"] else None
        rewards = [r for rs in self._rewards for r in rs]
        return {
            "step_s": step,
            "rollout_s": rollout,
            "score_s": score,
            "update_s": step - (rollout or 0.0) - (score or 0.0) if rollout is not None else None,
            "train_call_s": call,
            "optimizer_steps": len(self._clock.end),
            "tokens_generated": sum(self._tokens),
            "reward_mean": statistics.mean(rewards) if rewards else None,
        }
