"""A crafted two-model GRAFT run folder and a GRPO run folder with hand-chosen numbers."""
import json

import pytest
import yaml

from graft.storage.trajectory_store import TrajectoryStore
from graft.types import RolloutGroup


def _group(model, pid, rewards, step):
    G = len(rewards)
    return RolloutGroup(prompt_id=pid, problem=f"q {pid}", answer="1", source=model, holder=model, prompt_text=f"q {pid}",
                        prompt_token_ids=[1], responses=[f"r{i}" for i in range(G)], token_ids=[[1, 2]] * G,
                        old_logprobs=[[-0.1, -0.2]] * G, gen_token_ids=[[1, 2]] * G, gen_logprobs=[[-0.1, -0.2]] * G,
                        finished=[True] * G, rewards=[float(r) for r in rewards], status=["ok"] * G,
                        advantages=[0.0] * G, weights=[1.0] * G, compat=[1.0] * G, step=step)


# Store rewards (n = 2). Hand-computed complementarity:
#   step 1: k_A = [0, 1, 0, 2], k_B = [1, 0, 0, 0]
#           A->B: B all-fail p2, p3, p4; A solved p2, p4 -> 2/3
#           B->A: A all-fail p1, p3;     B solved p1     -> 1/2
#   step 2: k_A = [0, 0, 1], k_B = [0, 1, 0]
#           A->B: B all-fail p1, p3; A solved p3 -> 1/2
#           B->A: A all-fail p1, p2; B solved p2 -> 1/2
#   overall A->B = (2 + 1) / (3 + 2) = 0.6 ; B->A = (1 + 1) / (2 + 2) = 0.5
STORE = {
    1: {"A": {"p1": [0, 0], "p2": [1, 0], "p3": [0, 0], "p4": [1, 1]},
        "B": {"p1": [1, 0], "p2": [0, 0], "p3": [0, 0], "p4": [0, 0]}},
    2: {"A": {"p1": [0, 0], "p2": [0, 0], "p3": [1, 0]},
        "B": {"p1": [0, 0], "p2": [1, 0], "p3": [0, 0]}},
}


def _resp(pid, i, s, admitted):
    return {"prompt_id": pid, "index": i, "reward_source": 1.0 if i == 0 else 0.0, "reward_receiver": None,
            "advantage": 0.7, "mean_logp_receiver": -0.7, "mean_logp_source": -0.6, "s": s, "admitted": admitted,
            "weight": min(s, 1.0) if admitted else 0.0, "receiver_tokens": 5, "source_tokens": 5}


# Audit: s values A->B [0.9, 0.5, 0.7, 2.5] (admitted T F F T); B->A [1.2, 0.85, 0.95, 0.81] (all admitted)
AUDIT = [
    {"step": 1, "source": "A", "receiver": "B", "m": 1, "selected": ["p4"],
     "candidates": [{"prompt_id": "p2", "k_source": 1, "k_receiver": 0}, {"prompt_id": "p4", "k_source": 2, "k_receiver": 0}],
     "responses": [_resp("p4", 0, 0.9, True), _resp("p4", 1, 0.5, False)]},
    {"step": 1, "source": "B", "receiver": "A", "m": 1, "selected": ["p1"],
     "candidates": [{"prompt_id": "p1", "k_source": 1, "k_receiver": 0}],
     "responses": [_resp("p1", 0, 1.2, True), _resp("p1", 1, 0.85, True)]},
    {"step": 2, "source": "A", "receiver": "B", "m": 1, "selected": ["p3"],
     "candidates": [{"prompt_id": "p3", "k_source": 1, "k_receiver": 0}],
     "responses": [_resp("p3", 0, 0.7, False), _resp("p3", 1, 2.5, True)]},
    {"step": 2, "source": "B", "receiver": "A", "m": 1, "selected": ["p2"],
     "candidates": [{"prompt_id": "p2", "k_source": 1, "k_receiver": 0}],
     "responses": [_resp("p2", 0, 0.95, True), _resp("p2", 1, 0.81, True)]},
]


def _metrics(mode):
    rows = []
    # clip rates of A: own_low 0.01 0.03 0.02 ; peer_low 0 0.004 0 ; peer_high 0 0.006 0 ; peer responses 0 4 2
    # -> own_low mean 0.02 ; peer over steps 2, 3: low 0.002, high 0.003 ; zero-clip share 1/2
    clip_a = [(0.01, 0.02, 0.0, 0.0, 0), (0.03, 0.04, 0.004, 0.006, 4), (0.02, 0.03, 0.0, 0.0, 2)]
    clip_b = [(0.0, 0.01, 0.0, 0.0, 0), (0.0, 0.01, 0.01, 0.0, 2), (0.0, 0.01, 0.03, 0.02, 2)]
    comp_ab = [0.5, 1.0, None]     # logged complementarity A->B (differs from the store on purpose)
    af_b = [0.5, 0.25, 0.0]        # B's all-fail fraction, the weights of the metrics-only overall
    for i, step in enumerate((1, 2, 3)):
        r = {"step": step, "epoch": 0, "time/step_s": 3600.0 * (i + 1), "complementarity/A->B": comp_ab[i],
             "complementarity/B->A": 0.25, "B/all_fail_frac": af_b[i], "A/all_fail_frac": 0.5}
        for m, clip, rew in (("A", clip_a[i], 0.1 * (i + 1)), ("B", clip_b[i], 0.2 + 0.05 * i)):
            ol, oh, pl, ph, pr = clip
            r |= {f"{m}/reward/mean": rew, f"{m}/clip_frac/own_low": ol, f"{m}/clip_frac/own_high": oh,
                  f"{m}/clip_frac/peer_low": pl, f"{m}/clip_frac/peer_high": ph, f"{m}/tokens/generated": 1000 * (i + 1),
                  f"{m}/peer_responses": pr if mode == "graft" else 0}
        if mode == "graft":
            r |= {"exchange/A->B/candidates": 2, "exchange/A->B/m": 1, "exchange/A->B/kept_prompts": 1,
                  "exchange/A->B/transferred": 2, "exchange/A->B/admitted": 1, "exchange/B->A/candidates": 1}
        if step >= 2:
            r |= {"eval/A/val/pass@1": 0.3, "eval/B/val/pass@1": 0.2 + 0.1 * (step == 2)}
        rows.append(r)
    return rows


def make_run(root, mode="graft", store=True):
    root.mkdir(parents=True, exist_ok=True)
    cfg = {"run_dir": str(root), "seed": 0, "models": [{"name": "A", "path": "x"}, {"name": "B", "path": "y"}],
           "exchange": {"mode": mode, "delta": 0.8}, "rollout": {"n": 2}}
    (root / "config.yaml").write_text(yaml.safe_dump(cfg))
    with open(root / "metrics.jsonl", "w") as f:
        for r in _metrics(mode):
            f.write(json.dumps(r) + "\n")
        f.write('{"step": 4, "A/rew')  # torn last line of a killed run
    if mode == "graft":
        with open(root / "audit.jsonl", "w") as f:
            for rec in AUDIT:
                f.write(json.dumps(rec) + "\n")
    if store:
        st = TrajectoryStore(root / "trajectories", run_id="test")
        for step, by_model in STORE.items():
            groups = [_group(m, pid, rw, step) for m, d in by_model.items() for pid, rw in d.items()]
            st.write_step(step, 0, groups, {"A": "tokA", "B": "tokB"})
    return root


@pytest.fixture
def graft_run(tmp_path):
    return make_run(tmp_path / "graft_run", "graft")


@pytest.fixture
def grpo_run(tmp_path):
    return make_run(tmp_path / "grpo_run", "grpo", store=False)
