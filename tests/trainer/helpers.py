"""Shared pieces of the trainer tests: tiny configs and a crafted reward rule."""
from __future__ import annotations

import torch

from graft.config import load_config
from graft.trainer import loop


def tiny_config(tmp_path, llama_dir, gemma_dir, *overrides, models=("A", "B")):
    paths = {"A": llama_dir, "B": gemma_dir}
    model_yaml = ", ".join(f"{{name: {m}, path: '{paths[m]}', template: plain, lr: 1.0e-3}}" for m in models)
    base = [
        f"run_dir={tmp_path / 'run'}", "steps=2", "batch_prompts=4", "seed=3", "progress=false",
        f"models=[{model_yaml}]",
        "data.arithmetic.num_prompts=16", "rollout.n=4", "rollout.max_new_tokens=6", "rollout.batch_size=16",
        "reward.workers=0", "data.shuffle=false", "update.num_minibatches=2", "update.micro_batch_size=8",
        "checkpoint.save_final=true",
    ]
    return load_config(None, [*base, *overrides])


def grade_by(solvers):
    """A stand-in for ``loop.grade``: ``solvers(p)`` maps prompt number p to {model: k}; samples 0..k-1 of that
    model's group succeed, everything else fails (peer responses are re-graded by the same rule: it reads the source)."""

    def grade(run, groups):
        for g in groups:
            k = solvers(int(g.prompt_id.split("-")[-1])).get(g.source, 0)
            g.rewards = [1.0 if i < k else 0.0 for i in g.index]
            g.status = ["ok"] * g.size

    return grade


def crafted_rewards(monkeypatch):
    """Replace verification by a rule on (source, prompt, sample): A solves even-numbered
    prompts, B odd ones, with k = 1 + (p // 2) % 3 successes (samples 0..k-1) out of n = 4;
    everything else fails. Every step then has complementary all-fail groups in both
    directions, whatever the random models write. Transferred responses are re-verified
    with the same rule (it looks at the source)."""

    def grade(run, groups):
        for g in groups:
            p = int(g.prompt_id.split("-")[-1])
            solver = "A" if p % 2 == 0 else "B"
            k = 1 + (p // 2) % 3
            g.rewards = [1.0 if (g.source == solver and i < k) else 0.0 for i in g.index]
            g.status = ["ok"] * g.size

    monkeypatch.setattr(loop, "grade", grade)


def params(run_or_learners) -> dict[str, torch.Tensor]:
    learners = run_or_learners.learners if hasattr(run_or_learners, "learners") else run_or_learners
    return {f"{n}.{k}": v.detach().clone() for n, lrn in learners.items() for k, v in lrn.policy.model.named_parameters()}


def install_crafted_rewards() -> None:
    """The crafted reward rule for a subprocess run (no pytest monkeypatch there)."""

    class _MP:
        @staticmethod
        def setattr(obj, name, value):
            setattr(obj, name, value)

    crafted_rewards(_MP)
