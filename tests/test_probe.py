"""`graft probe`: end to end on tiny random models with the real
tokenizers — the JSON says which config *and overrides* it measured, its counts agree with each other, and it
predicts the exchange per step at the configured batch_prompts with the training exchange's own code; the
prediction hand-worked on crafted groups; --checkpoint loads a run's weights."""
import json
from pathlib import Path

import torch

from graft.commands.cli import main
from graft.commands.probe import batches, predict_exchange, predict_pairings, tables
from graft.config import load_config
from graft.types import RolloutGroup

REPO = Path(__file__).resolve().parents[1]


def _models(llama, gemma) -> str:
    return (f"models=[{{name: A, path: '{llama}', template: plain, lr: 1.0e-3}}, "
            f"{{name: B, path: '{gemma}', template: fewshot, fewshot: 3, lr: 1.0e-3}}]")


def test_probe_records_its_overrides_consistent_counts_and_a_prediction(tmp_path, tiny_llama_dir, tiny_gemma_dir,
                                                                         capsys):
    overrides = [_models(tiny_llama_dir, tiny_gemma_dir), "rollout.n=2", "rollout.max_new_tokens=4",
                 "reward.workers=0", "threads=1", "batch_prompts=2", "update.num_minibatches=1", "progress=false"]
    out, samples = tmp_path / "probe.json", tmp_path / "samples.jsonl"
    assert main(["probe", str(REPO / "configs" / "default.yaml"), "--prompts", "5", "--compat", "--out", str(out),
                 "--samples", str(samples), *overrides]) == 0
    r = json.loads(out.read_text())
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(rows) == 2 * 5 * 2 and {x["model"] for x in rows} == {"A", "B"}   # 2 models x 5 prompts x n = 2
    for name, m in r["models"].items():   # the samples file and the statistics describe the same responses
        mine = [x for x in rows if x["model"] == name]
        assert abs(sum(x["reward"] for x in mine) / len(mine) - m["reward_mean"]) < 1e-9
        assert sum(m["statuses"].values()) == len(mine) and all(isinstance(x["response"], str) for x in mine)
    assert r["config"].endswith("default.yaml") and r["overrides"] == overrides   # a rerun needs both
    assert r["prompts"] == 5 and r["n"] == 2 and set(r["models"]) == {"A", "B"}
    for m in r["models"].values():
        assert 0.0 <= m["reward_mean"] <= 1.0 and 0.0 <= m["boxed_frac"] <= 1.0
        assert abs(m["prompts_solved"] + m["all_fail_frac"] - 1.0) < 1e-9   # every prompt is one or the other
    assert set(r["complementarity"]) == {"A->B", "B->A"}
    # every response of the 5 x 2 is scored under the other model
    assert r["compat"]["A->B"]["all"]["transferred"] == r["compat"]["B->A"]["all"]["transferred"] == 10
    pe = r["predicted_exchange"]
    assert pe["batch_prompts"] == 2 and pe["batches"] == 8 * (5 // 2)     # 8 shuffles, 2 whole batches each
    for d in pe["directions"].values():
        assert d["kept_prompts"] <= d["candidates"] <= 2 and d["m"] <= d["candidates"]
        assert d["admitted_correct"] <= d["admitted"] <= d["transferred"] == 2 * d["kept_prompts"]   # n = 2
    printed = capsys.readouterr().out
    assert "predicted exchange per step at batch_prompts=2" in printed and "| A->B |" in printed


def test_checkpoint_weights_are_loaded(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    from graft.trainer import learner as learner_mod, loop
    from tests.trainer.helpers import crafted_rewards, tiny_config

    with monkeypatch.context() as mp:
        crafted_rewards(mp)
        cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=1")
        loop.train(cfg)
    step = Path(cfg.run_dir) / "checkpoints" / "step_000001"
    seen = {}
    real = learner_mod.Learner.local.__func__

    def local(cls, mcfg, device="cpu", weights_from=None, engine="hf"):
        seen[mcfg.name] = weights_from
        return real(cls, mcfg, device, weights_from, engine)

    monkeypatch.setattr(learner_mod.Learner, "local", classmethod(local))
    (tmp_path / "cfg.yaml").write_text(Path(cfg.run_dir, "config.yaml").read_text())
    assert main(["probe", str(tmp_path / "cfg.yaml"), "--prompts", "2", "--checkpoint", str(step)]) == 0
    assert seen == {"A": step / "A", "B": step / "B"}
    assert main(["probe", str(tmp_path / "cfg.yaml"), "--checkpoint", str(tmp_path / "nope")]) == 2


# ----------------------------------------------------------------------------- the prediction, hand-worked

def _group(source: str, pid: str, rewards: list[float]) -> RolloutGroup:
    G = len(rewards)
    return RolloutGroup(prompt_id=pid, problem=f"q {pid}", answer="1", source=source, holder=source,
                        prompt_text=pid, prompt_token_ids=[1], responses=[f"{i}" for i in range(G)],
                        token_ids=[[10 + i] for i in range(G)], old_logprobs=[[-1.0]] * G,
                        gen_token_ids=[[10 + i] for i in range(G)], gen_logprobs=[[-1.0]] * G, finished=[True] * G,
                        rewards=list(rewards), status=["ok"] * G, advantages=[0.0] * G)


class _Receiver:
    """Scores response i at log-prob -1 per token when i is even (s = exp(-1 - -1) = 1 > δ = 0.8: admitted),
    -2 when odd (s = exp(-1) = 0.37: dropped)."""

    def __init__(self, name):
        self.name = name

    @property
    def codec(self):   # a test double: its own codec
        return self

    def encode_prompt(self, problem, messages=None):
        return [1]

    def render_prompt(self, problem, messages=None):
        return problem

    def encode_responses(self, texts, finished):
        return [[10 + int(t)] for t in texts]

    def token_logprobs(self, prompt_ids, response_ids, chunk, micro_batch, temperature, progress=False):
        return [torch.tensor([-1.0 if (r[0] - 10) % 2 == 0 else -2.0]) for r in response_ids]


def _cfg(*extra):
    return load_config(None, ["models=[{name: A, path: a}, {name: B, path: b}]", "rollout.n=4", "batch_prompts=2",
                              "update.num_minibatches=1", *extra])


def test_prediction_hand_worked():
    # k_A = [2, 0], k_B = [0, 1] (n = 4): C_{A->B} = {p0}, C_{B->A} = {p1}, m = min(1, 1) = 1 each way;
    # each direction transfers the 4 responses of its prompt, admits the even ones (2), of which the one
    # with index 0 is correct (rewards [1, 1, 0, 0] and [1, 0, 0, 0]): admitted_correct = 1.
    groups = {"A": [_group("A", "p0", [1, 1, 0, 0]), _group("A", "p1", [0, 0, 0, 0])],
              "B": [_group("B", "p0", [0, 0, 0, 0]), _group("B", "p1", [1, 0, 0, 0])]}
    pe = predict_exchange(groups, _cfg(), {"A": _Receiver("A"), "B": _Receiver("B")}, resamples=3, seed=0)
    want = {"candidates": 1, "m": 1, "kept_prompts": 1, "transferred": 4, "admitted": 2, "admitted_correct": 1,
            "admitted_correct_per_100_prompts": 50.0, "steps_exchanging": 1.0,    # 1 per step of 2 prompts
            "steps_admitting_correct": 1.0}
    assert pe["batches"] == 3 and pe["directions"] == {"A->B": want, "B->A": want} and pe["verdict"] is None
    # without --compat: the selection only
    pe = predict_exchange(groups, _cfg(), None, resamples=1, seed=0)
    assert pe["directions"]["A->B"] == {"candidates": 1, "m": 1, "kept_prompts": 1, "steps_exchanging": 1.0}


def test_verdict_when_one_direction_has_no_candidates():
    # B solves nothing: C_{B->A} is empty, so m = min(1, 0) = 0 and the balanced exchange moves nothing either way
    groups = {"A": [_group("A", "p0", [1, 1, 0, 0]), _group("A", "p1", [0, 0, 0, 0])],
              "B": [_group("B", "p0", [0, 0, 0, 0]), _group("B", "p1", [0, 0, 0, 0])]}
    pe = predict_exchange(groups, _cfg(), {"A": _Receiver("A"), "B": _Receiver("B")}, resamples=1, seed=0)
    assert pe["directions"]["A->B"]["candidates"] == 1 and pe["directions"]["A->B"]["m"] == 0
    assert pe["directions"]["A->B"]["admitted"] == 0 and pe["directions"]["B->A"]["candidates"] == 0
    assert pe["verdict"].startswith("this pair will exchange almost nothing at batch_prompts=2")
    # exchange.balance=none lets A->B through: 2 admitted per step, no verdict
    pe = predict_exchange(groups, _cfg("exchange.balance=none"), {"A": _Receiver("A"), "B": _Receiver("B")}, 1, 0)
    assert pe["directions"]["A->B"]["admitted"] == 2 and pe["verdict"] is None


def test_prediction_at_other_batch_sizes_from_the_same_samples():
    # A solves p0, p1 and fails p2, p3; B the other way round (n = 4, response 0 correct, even ones admitted).
    # One batch of 4: C_{A->B} = {p0, p1}, C_{B->A} = {p2, p3}, m = 2 each way: 2 admitted correct per step,
    # 2 * 100 / 4 = 50 per 100 prompts. Batches of 2 pair prompts at random: a batch of one kind has m = 0,
    # so at most as many per 100 prompts (balancing loses what falls in one-sided batches).
    groups = {"A": [_group("A", "p0", [1, 0, 0, 0]), _group("A", "p1", [1, 0, 0, 0]),
                    _group("A", "p2", [0, 0, 0, 0]), _group("A", "p3", [0, 0, 0, 0])],
              "B": [_group("B", "p0", [0, 0, 0, 0]), _group("B", "p1", [0, 0, 0, 0]),
                    _group("B", "p2", [1, 0, 0, 0]), _group("B", "p3", [1, 0, 0, 0])]}
    recv = {"A": _Receiver("A"), "B": _Receiver("B")}
    four = predict_exchange(groups, _cfg(), recv, resamples=4, seed=0, batch_prompts=4)
    assert four["batch_prompts"] == 4 and four["directions"]["A->B"]["m"] == 2
    assert four["directions"]["A->B"]["admitted_correct"] == 2
    assert four["directions"]["A->B"]["admitted_correct_per_100_prompts"] == 50.0
    two = predict_exchange(groups, _cfg(), recv, resamples=4, seed=0)
    assert two["batch_prompts"] == 2 and two["directions"]["A->B"]["admitted_correct_per_100_prompts"] <= 50.0
    # a batch of 2 admits a correct response only when it holds one prompt of each kind: 2 of the 3 ways to pair
    # {p0, p1, p2, p3}; seed 0's 4 shuffles hold both kinds, so the share of such steps is strictly between 0 and 1
    assert 0 < two["directions"]["A->B"]["steps_admitting_correct"] < 1 == four["directions"]["A->B"]["steps_admitting_correct"]
    text = tables({"models": {}, "complementarity": {}, "predicted_exchange": two,
                   "predicted_exchange_by_batch": {"2": two, "4": four}})
    assert text.count("predicted exchange per step at batch_prompts=") == 2 and "batch_prompts=4" in text


def test_what_each_pairing_chooses_hand_worked():
    # Three models, one batch of 4 prompts (n = 4, response 0 correct, even responses admitted at s = 1, odd ones
    # dropped at s = exp(-1) = 0.37):   k_A = [1, 0, 0, 0], k_B = [0, 1, 0, 0], k_C = [1, 0, 1, 1].
    # Balanced selections: A->B {p0}, B->A {p1}; A<->C none (C_{A->C} is empty, m = 0); B->C {p1}, C->B {p0, p2, p3}
    # (m = 1, every k_C ties at 1: all kept).
    # complementary: A fails p1-p3: B solves 1, C 2 -> C (which hands A nothing: m = 0); B fails p0, p2, p3: A 1,
    #   C 3 -> C (p0, p2, p3: 12 transferred, 6 admitted, 3 correct); C fails p1: A 0, B 1 -> B (2 admitted, 1 correct).
    # compatible: every handed group has median s = (0.37 + 1) / 2; into A only B handed anything -> B; into B
    #   A and C tie -> A (p0: 2 admitted, 1 correct); into C only B -> B.
    # all: B is offered p0 by A and C (k 1 each, same mean s: model order -> A), so C->B hands p2, p3: 4 admitted, 2 correct.
    groups = {m: [_group(m, f"p{i}", [1.0] * x + [0.0] * (4 - x)) for i, x in enumerate(k)]
              for m, k in {"A": [1, 0, 0, 0], "B": [0, 1, 0, 0], "C": [1, 0, 1, 1]}.items()}
    cfg = load_config(None, ["models=[{name: A, path: a}, {name: B, path: b}, {name: C, path: c}]", "rollout.n=4",
                             "batch_prompts=4", "update.num_minibatches=1"])
    recv = {m: _Receiver(m) for m in "ABC"}
    got = predict_pairings(groups, cfg, recv, resamples=1, seed=0)["pairing"]
    assert list(got) == ["all", "complementary", "compatible"]
    comp, compat = got["complementary"]["directions"], got["compatible"]["directions"]
    assert {d for d, v in comp.items() if v["paired"]} == {"C->A", "C->B", "B->C"}
    assert (comp["C->B"]["admitted"], comp["C->B"]["admitted_correct"], comp["C->A"]["admitted"]) == (6, 3, 0)
    assert {d for d, v in compat.items() if v["paired"]} == {"B->A", "A->B", "B->C"}
    assert (compat["A->B"]["admitted"], compat["A->B"]["admitted_correct"], compat["C->B"]["admitted"]) == (2, 1, 0)
    assert "paired" not in got["all"]["directions"]["A->B"]
    text = tables({"models": {}, "complementarity": {}, "predicted_exchange": got["all"], "pairing": got})
    assert "| C->B | 100% / 4.00 / 2.00 | 100% / 6.00 / 3.00 | 0% / 0.00 / 0.00 |" in text
    assert predict_pairings(groups, cfg, None, resamples=1, seed=0) == {"pairing": None}     # needs --compat
    assert predict_pairings({m: groups[m] for m in "AB"}, cfg, recv, resamples=1, seed=0) == {}   # nothing to choose


def test_batches_partition_the_probed_prompts():
    plan = batches(10, 4, resamples=2, seed=0)
    assert len(plan) == 2 * (10 // 4) and all(len(b) == 4 for b in plan)
    assert len(set(plan[0]) | set(plan[1])) == 8                 # one shuffle: disjoint batches
    assert batches(3, 8, resamples=5, seed=0) == [[0, 1, 2]]     # fewer prompts than a batch: all of them once


def test_the_command_as_a_process_answers_help_and_refuses_a_missing_config_in_one_line():
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "graft", "probe", "--help"], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0 and p.stdout.startswith("usage: graft probe") and "--checkpoint STEP_DIR" in p.stdout
    p = subprocess.run([sys.executable, "-m", "graft", "probe", "nope.yaml"], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 2 and p.stderr.strip() == "error: config file not found: nope.yaml"
