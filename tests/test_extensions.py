"""Every extension point of graft, registered from this test file with no edit of graft, runs end to end.

One toy of each kind registers itself here as a user's module would (docs/design.md, "Extending graft"): a task with
its own settings section, a problem family, a domain, a pairing, an exchange kind, an update rule, a learning-rate
schedule, a rollout engine and a tracker. Two tiny training runs select them by name in the config, and each toy
leaves evidence that it ran (its prompts, its rewards, its audit records, its counters).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from graft.config import ConfigError, load_config, show_config
from graft.config.checks import check
from graft.data.code_families import CodeFamily, CodeSpec
from graft.data.code_task import make_code_task, solution
from graft.data.tasks import Task
from graft.domains import Domain
from graft.exchange.kinds import Exchange
from graft.exchange.pairing import ChoosePeer
from graft.policy.engines import HFEngine
from graft.registry import CODE_FAMILIES, DOMAINS, ENGINES, EXCHANGES, FAMILIES, LR_SCHEDULES, PAIRINGS, RULES, TASKS, TRACKERS
from graft.trainer import loop
from graft.trainer.rules import UpdateRule
from graft.types import ExchangeResult
from tests.trainer import toy_domain

pytestmark = pytest.mark.slow


# ----------------------------------------------------------------------------- the toys, as a user writes them
@dataclasses.dataclass
class CountdownConfig:
    """Settings of the countdown task."""

    num_prompts: int = 8
    """How many problems."""
    start: int = 10
    """The first number counted down from."""

    def __post_init__(self) -> None:
        check(self.start >= 1, "start", f"must be >= 1, got {self.start}")


class Countdown(Task):
    """``What is N minus one?`` for N = start, start + 1, ..."""

    settings = CountdownConfig

    def rows(self, settings: CountdownConfig) -> list[dict]:
        return [{"id": f"count-{i:05d}", "problem": f"What is {settings.start + i} minus one?",
                 "answer": str(settings.start + i - 1)} for i in range(settings.num_prompts)]

    def families(self, settings: CountdownConfig) -> list[str]:
        return ["count"]


def triple(rng, max_operand):
    """A problem family: three times a number."""
    a = rng.randint(0, max_operand)
    return f"What is three times {a}?", 3 * a


def last_peer(solved: torch.Tensor, s: list[torch.Tensor]) -> tuple[torch.Tensor, list[float | None]]:
    """A pairing rule: the last peer in model order."""
    chosen = torch.zeros(solved.shape[1], dtype=torch.bool)
    chosen[-1] = True
    return chosen, [None] * solved.shape[1]


class Mirror(Exchange):
    """An exchange kind that hands nothing over and counts its calls."""

    method, hands_over = "GRPO (counted)", False
    calls = 0

    def __call__(self, groups, step):
        type(self).calls += 1
        return ExchangeResult.unchanged(groups)

    @classmethod
    def summary(cls, cfg):
        return "mirror: every model trains on its own groups"


class CountingRule(UpdateRule):
    """GRAFT's update, counting the batches it prepares."""

    summary = "GRAFT, counted"
    prepared = 0

    def prepare(self, groups):
        type(self).prepared += 1
        return groups


class CountingEngine(HFEngine):
    """graft's sampler, counting the engines made."""

    made = 0

    def __init__(self, policy) -> None:
        super().__init__(policy)
        type(self).made += 1


class ListTracker:
    """A tracker that keeps what it is sent."""

    module, package = "json", "json"
    logged: list[int] = []

    def __init__(self, run_dir: Path, cfg, start_step: int) -> None:
        self.run_dir = run_dir

    def log(self, step: int, values: dict, completions: dict) -> None:
        type(self).logged.append(step)

    def close(self) -> None:
        pass


TOY_DOMAIN = Domain(verify_fn="tests.trainer.toy_domain:toy_verify", instruction=toy_domain.INSTRUCTION,
                    fewshot=toy_domain.FEWSHOT, make_reference=toy_domain.toy_reference)


@contextlib.contextmanager
def registered(*entries):
    """Register ``(registry, name, object)`` entries for the duration of the block, then remove them."""
    try:
        for registry, name, obj in entries:
            registry.register(name, obj)
        yield
    finally:
        for registry, name, _ in entries:
            registry.unregister(name)


def _models(**paths: str) -> str:
    return "models=[" + ", ".join(f"{{name: {n}, path: '{p}', template: plain, lr: 1.0e-3}}" for n, p in paths.items()) + "]"


BASE = ["steps=2", "batch_prompts=2", "seed=3", "progress=false", "rollout.n=2", "rollout.max_new_tokens=5",
        "rollout.batch_size=16", "reward.workers=1", "data.shuffle=false", "update.num_minibatches=1",
        "update.micro_batch_size=8", "checkpoint.save_final=false"]


def _rows(run_dir: Path) -> list[dict]:
    return [r for f in sorted((run_dir / "trajectories").glob("step_*.parquet")) for r in pq.read_table(f).to_pylist()]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# ----------------------------------------------------------------------------- run 1
def test_a_task_domain_pairing_rule_schedule_engine_and_tracker_of_ones_own_train(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    toys = [(TASKS, "countdown", Countdown()), (DOMAINS, "toy_ext", TOY_DOMAIN), (PAIRINGS, "last_peer", ChoosePeer(last_peer)),
            (RULES, "counting", CountingRule), (LR_SCHEDULES, "halving", lambda p: 0.5), (ENGINES, "counting", CountingEngine),
            (TRACKERS, "list", ListTracker)]
    CountingRule.prepared, CountingEngine.made, ListTracker.logged = 0, 0, []
    with registered(*toys):
        cfg = load_config(None, [*BASE, f"run_dir={tmp_path / 'run'}", _models(A=tiny_llama_dir, B=tiny_gemma_dir, C=tiny_llama_dir),
                                 "data.train=countdown", "data.countdown.start=20", "reward.domain=toy_ext",
                                 "exchange.pairing=last_peer", "update.rule=counting", "models.0.lr_schedule=halving",
                                 "rollout.engine=counting", "logging.report_to=[list]"])
        assert "data.countdown.start" in show_config(cfg) and cfg.data.countdown.start == 20   # its settings section
        with pytest.raises(ValueError, match=r"data\.countdown\.start: must be >= 1, got 0"):
            load_config(None, [_models(A="a"), "data.train=countdown", "data.countdown.start=0", "exchange.kind=none"])
        loop.train(cfg)
    run_dir = tmp_path / "run"
    rows = _rows(run_dir)
    assert rows and all(r["prompt_id"].startswith("count-") for r in rows)                       # the task's prompts
    assert {r["problem"] for r in rows} <= {f"What is {20 + i} minus one?" for i in range(8)}   # from its settings
    assert all((r["reward"], r["verify_status"]) == toy_domain.toy_verify(r["response"], r["answer"]) for r in rows)
    audit = _lines(run_dir / "audit.jsonl")
    assert audit and all(a["pairing"]["rule"] == "last_peer" for a in audit)                     # the pairing chose
    assert all(a["pairing"]["chosen"] == [["A", "B", "C"][-1] if a["receiver"] != "C" else "B"] for a in audit)
    metrics = _lines(run_dir / "metrics.jsonl")
    assert [m["A/learning_rate"] for m in metrics] == [0.5e-3, 0.5e-3]                           # the schedule
    assert [m["B/learning_rate"] for m in metrics] == [1e-3, 1e-3]
    assert CountingRule.prepared >= 2 * 3 and CountingEngine.made == 3 and ListTracker.logged == [1, 2]
    assert all(name not in reg for reg, name, _ in toys)                                          # unregistered again


# ----------------------------------------------------------------------------- run 2
def test_a_problem_family_and_an_exchange_kind_of_ones_own_train(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    Mirror.calls = 0
    with registered((FAMILIES, "triple", triple), (EXCHANGES, "mirror", Mirror)):
        cfg = load_config(None, [*BASE, f"run_dir={tmp_path / 'run'}", _models(A=tiny_llama_dir, B=tiny_gemma_dir),
                                 "data.arithmetic.families=[triple]", "data.arithmetic.num_prompts=8", "reward.domain=number",
                                 "exchange.kind=mirror"])
        loop.train(cfg)
    rows = _rows(tmp_path / "run")
    assert rows and all(r["prompt_id"].startswith("triple-") and r["problem"].startswith("What is three times ") for r in rows)
    assert Mirror.calls == 2 and not _lines(tmp_path / "run" / "audit.jsonl")
    metrics = _lines(tmp_path / "run" / "metrics.jsonl")
    assert "A/reward/family/triple" in metrics[0]                   # the family's own breakdown


TWO = ["models=[{name: A, path: a}, {name: B, path: b}]"]


def _negate() -> CodeSpec:
    """negate(x) returns -x."""
    return CodeSpec("negate", "x", "minus x", lambda x: -x, lambda rng: (rng.randint(2, 99),),
                    lambda rng: [(0,), (-1,), (rng.randint(10**8, 10**9),)], lambda rng: (rng.randint(-999, 999),),
                    "def negate(x):\n    return -x\n")


def test_a_code_family_of_ones_own_makes_rows_the_sandbox_grades():
    """A code family registered from this file is a choice of data.code_task.families (checked at load) and makes
    rows whose hidden tests its reference solution passes and a wrong program fails."""
    with registered((CODE_FAMILIES, "negate", CodeFamily(_negate, ((),)))):
        cfg = load_config(None, [*TWO, "data.train=code_task", "reward.domain=code", "data.code_task.families=[negate]",
                                 "data.code_task.num_prompts=3"])
        rows = make_code_task(3, 0, cfg.data.code_task.families)
        assert [r["id"] for r in rows] == ["negate-00000", "negate-00001", "negate-00002"]
        assert rows[0]["tests"][:2] == ["assert negate(0) == 0", "assert negate(-1) == 1"]   # the edge classes first
        assert solution(rows[0]) == "```python\ndef negate(x):\n    return -x\n```"
    with pytest.raises(ConfigError, match="data.code_task.families: must be a non-empty list of add"):
        load_config(None, [*TWO, "data.train=code_task", "reward.domain=code", "data.code_task.families=[negate]"])
