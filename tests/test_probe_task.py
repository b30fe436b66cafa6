"""scripts/probe_task.py end to end on tiny random models with the real tokenizers: the JSON it writes
says which config *and overrides* it measured, and its counts agree with each other."""
import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("probe_task", REPO / "scripts" / "probe_task.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)


def test_probe_records_its_overrides_and_consistent_counts(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    models = (f"models=[{{name: A, path: '{tiny_llama_dir}', template: plain, lr: 1.0e-3}}, "
              f"{{name: B, path: '{tiny_gemma_dir}', template: fewshot, fewshot: 3, lr: 1.0e-3}}]")
    overrides = [models, "rollout.n=2", "rollout.max_new_tokens=4", "reward.workers=0", "threads=1"]
    out = tmp_path / "probe.json"
    assert probe.main([str(REPO / "configs" / "default.yaml"), "--prompts", "5", "--compat", "--out", str(out),
                       *overrides]) == 0
    r = json.loads(out.read_text())
    assert r["config"].endswith("default.yaml") and r["overrides"] == overrides   # a rerun needs both
    assert r["prompts"] == 5 and r["n"] == 2 and set(r["models"]) == {"A", "B"}
    for m in r["models"].values():
        assert 0.0 <= m["reward_mean"] <= 1.0
        assert abs(m["prompts_solved"] + m["all_fail_frac"] - 1.0) < 1e-9   # every prompt is one or the other
    assert set(r["complementarity"]) == {"A->B", "B->A"}
    # every response of the 5 x 2 is scored under the other model
    assert r["compat"]["A->B"]["all"]["transferred"] == r["compat"]["B->A"]["all"]["transferred"] == 10
