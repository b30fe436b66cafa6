"""Three-model runs of the training loop under each exchange.pairing, on the tiny random models of the tests
with crafted rewards (tests/trainer/test_resume_pairing.py's rule), so that every pairing has something to choose.
Mechanics only: these models write noise and the rewards are crafted; what the real trio chooses is the probe's.

    OMP_NUM_THREADS=1 taskset -c 1 python results/pairing/tiny_runs.py results/pairing/tiny
    python results/pairing/rederive.py results/pairing/tiny/*

Writes OUT/<pairing>/{config.yaml,audit.jsonl,metrics.jsonl,summary.json} (checkpoints and the trajectory store
go to a temporary folder).
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from graft.config import load_config
from graft.policy.tiny import build_tiny_model
from graft.trainer import loop

MODELS = ("A", "B", "C")


def grade(run, groups):
    """A solves prompts p % 4 in (0, 1), B p % 4 == 2, C p % 4 == 3, with k = 1 + (p // 4) % 3 of 4 samples;
    B also solves p % 6 == 5 (k = 1)."""
    for g in groups:
        p = int(g.prompt_id.split("-")[-1])
        k = {"AABC"[p % 4]: 1 + (p // 4) % 3}
        if p % 6 == 5:
            k.setdefault("B", 1)
        g.rewards = [1.0 if i < k.get(g.source, 0) else 0.0 for i in g.index]
        g.status = ["ok"] * g.size


def main(out: Path) -> None:
    loop.grade = grade
    with tempfile.TemporaryDirectory() as tmp:
        paths = {"A": build_tiny_model("llama", Path(tmp) / "llama", seed=0),
                 "B": build_tiny_model("gemma3", Path(tmp) / "gemma", seed=0)}
        paths["C"] = paths["A"]
        models = ", ".join(f"{{name: {m}, path: '{paths[m]}', template: plain, lr: 1.0e-3}}" for m in MODELS)
        for pairing in ("all", "complementary", "compatible"):
            run_dir = Path(tmp) / pairing
            cfg = load_config(None, [f"run_dir={run_dir}", "seed=3", "steps=4", "progress=false", "threads=1",
                                     f"models=[{models}]", "batch_prompts=6", "data.arithmetic.num_prompts=40",
                                     "data.shuffle=false", "rollout.n=4", "rollout.max_new_tokens=5",
                                     "rollout.batch_size=24", "reward.workers=0", "update.num_minibatches=2",
                                     "update.micro_batch_size=8", "exchange.delta=0.0", f"exchange.pairing={pairing}",
                                     "exchange.pairing_window=2", "checkpoint.save_final=false"])
            loop.train(cfg)
            dest = out / pairing
            dest.mkdir(parents=True, exist_ok=True)
            for name in ("config.yaml", "audit.jsonl", "metrics.jsonl", "summary.json"):
                if (run_dir / name).exists():
                    shutil.copy(run_dir / name, dest / name)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
