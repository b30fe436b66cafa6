"""``exchange.pairing: complementary`` across a resume: the pairing window is checkpointed (the live exchange's
state), so a resumed run chooses the same peers as an uninterrupted one, and its last step's choice reads the
evidence of steps from before the resume."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from graft.config import load_config
from graft.trainer import loop
from tests.trainer.helpers import grade_by
from tests.trainer.test_resume import _assert_same_steps, _final_params, _metrics

MODELS = ("A", "B", "C")


def solvers(p: int) -> dict[str, int]:
    """Crafted successes (k of 4 samples): A solves prompts p % 4 in (0, 1), B p % 4 == 2, C p % 4 == 3, with
    k = 1 + (p // 4) % 3; on p % 6 == 5 B solves it too (k = 1)."""
    out = {"AABC"[p % 4]: 1 + (p // 4) % 3}
    if p % 6 == 5:
        out.setdefault("B", 1)
    return out


grade = grade_by(solvers)


def _config(root: Path, paths: dict, *overrides: str):
    models = ", ".join(f"{{name: {m}, path: '{paths[m]}', template: plain, lr: 1.0e-3}}" for m in MODELS)
    return load_config(None, [f"run_dir={root / 'run'}", "seed=3", "progress=false", f"models=[{models}]",
                              "batch_prompts=6", "data.arithmetic.num_prompts=40", "data.shuffle=false", "rollout.n=4",
                              "rollout.max_new_tokens=5", "rollout.batch_size=24", "reward.workers=0",
                              "update.num_minibatches=2", "update.micro_batch_size=8", "exchange.delta=0.0",
                              "exchange.pairing=complementary", "exchange.pairing_window=2",
                              "checkpoint.save_every=1", *overrides])


def _decisions(run_dir: Path) -> list[tuple]:
    audit = [json.loads(x) for x in (run_dir / "audit.jsonl").read_text().splitlines()]
    return [(a["step"], a["source"], a["receiver"], a["pairing"]["chosen"], a["pairing"]["score"],
             a["pairing"]["evidence"]["solved"], a["selected"], [r["prompt_id"] for r in a["responses"]]) for a in audit]


@pytest.mark.slow
def test_complementary_pairing_resumes_as_uninterrupted(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    monkeypatch.setattr(loop, "grade", grade)
    paths = {"A": tiny_llama_dir, "B": tiny_gemma_dir, "C": tiny_llama_dir}
    full = _config(tmp_path / "full", paths, "steps=3")
    loop.train(full)
    loop.train(_config(tmp_path / "part", paths, "steps=2"))
    part = _config(tmp_path / "part", paths, "steps=3", "resume=true")
    loop.train(part)
    a, b = _decisions(Path(full.run_dir)), _decisions(Path(part.run_dir))
    assert a == b
    last = max(d[0] for d in a)
    assert any(d[0] == last and d[4] != d[5] for d in a), "the last step's scores must read pre-resume evidence"
    assert any(d[1] not in d[3] for d in a), "some direction must be left out by the pairing"
    _assert_same_steps(_metrics(Path(full.run_dir)), _metrics(Path(part.run_dir)), names=MODELS)
    pa, pb = _final_params(Path(full.run_dir), full), _final_params(Path(part.run_dir), part)
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=0, atol=1e-6)
