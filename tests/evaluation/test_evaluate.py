"""evaluate(): hand-computed pass@1 with a fake sampler, mean ± std over repeats, resume after a kill."""
import json
import math
import sys
import types
from dataclasses import dataclass, replace

import pytest

from graft.commands.eval_cli import parse_data_args
from graft.config import EvalConfig
from graft.evaluation.evaluate import (DEFAULT_MAX_NEW_TOKENS, EvalError, best_checkpoint, evaluate,
                                      evaluate_during_training, read_records)
from graft.policy.sampling import SamplingParams, eval_sampling
from graft.seeds import derive_seed
from graft.types import Prompt


def protocol(n=4, max_new_tokens=DEFAULT_MAX_NEW_TOKENS, **changes) -> SamplingParams:
    """The evaluation defaults (EvalConfig's temperature and top-p, seed 0) with ``n`` samples and ``changes``."""
    return replace(eval_sampling(EvalConfig(n=n), max_new_tokens), **changes)


@dataclass
class FakeSample:
    token_ids: list
    logprobs: list
    text: str
    finished: bool


class FakePolicy:
    """Duck-typed policy: fixed response texts per (repeat, problem); counts generate calls and prompts."""

    def __init__(self, texts_by_repeat: dict[int, dict[str, list[str]]], seed=0, chunk_starts=range(0, 100),
                 fail_on_call: int | None = None):
        self.texts = texts_by_repeat
        self.problems: list[str] = []
        self.calls = 0
        self.generated: list[str] = []
        self.fail_on_call = fail_on_call
        self.seed_to_repeat = {derive_seed(seed, r, c): r for r in texts_by_repeat for c in chunk_starts}

    @property
    def codec(self):   # a test double: its own codec
        return self

    def encode_prompt(self, problem, messages=None):
        if problem not in self.problems:
            self.problems.append(problem)
        return [self.problems.index(problem)]

    def generate(self, prompt_ids, params, progress=False, desc=None):
        self.calls += 1
        if self.fail_on_call is not None and self.calls == self.fail_on_call:
            raise KeyboardInterrupt("simulated kill")
        n, r = params.n, self.seed_to_repeat[params.seed]
        out = []
        for (idx,) in prompt_ids:
            problem = self.problems[idx]
            self.generated.append(problem)
            texts = self.texts[r][problem]
            assert len(texts) == n
            out.append([FakeSample([1] * (len(t) % 7 + 1), [], t, not t.endswith("...")) for t in texts])
        return out


class ExactGrader:
    """Grader stand-in: reward 1 when the last \\boxed{...} equals the answer string."""

    def grade(self, responses, answers, progress=False, completion_ids=None):
        rewards, statuses = [], []
        for text, ans in zip(responses, answers):
            if "\\boxed{" not in text:
                rewards.append(0.0)
                statuses.append("no_answer")
                continue
            got = text.rsplit("\\boxed{", 1)[1].split("}", 1)[0]
            rewards.append(1.0 if got == ans else 0.0)
            statuses.append("ok")
        return rewards, statuses


PROMPTS = [Prompt("p1", "1+1", "2"), Prompt("p2", "2+2", "4"), Prompt("p3", "3+3", "6"), Prompt("p4", "4+4", "8")]
B = lambda x: f"so the answer is \\boxed{{{x}}}"  # noqa: E731

# repeat 0: p1 2/4, p2 0/4, p3 4/4, p4 1/4 -> pass@1 = 1.75/4 = 0.4375
# repeat 1: p1 1/4, p2 1/4, p3 2/4, p4 0/4 -> pass@1 = 1.0/4 = 0.25
TEXTS = {
    0: {"1+1": [B(2), B(3), "no idea", B(2)], "2+2": [B(5)] * 4, "3+3": [B(6)] * 4, "4+4": [B(8), B(7), B(7), "..."]},
    1: {"1+1": [B(2), B(3), B(3), B(3)], "2+2": [B(4), B(5), B(5), B(5)], "3+3": [B(6), B(6), B(1), B(1)],
        "4+4": [B(1)] * 4},
}


def test_pass_at_1_and_mean_std_over_repeats(tmp_path):
    pol = FakePolicy(TEXTS)
    res = evaluate(pol, {"toy": PROMPTS}, ExactGrader(), tmp_path, protocol(batch_size=8), repeats=2, progress=False)
    d = res["datasets"]["toy"]
    assert d["pass@1"]["per_repeat"] == pytest.approx([0.4375, 0.25])
    assert d["pass@1"]["mean"] == pytest.approx(0.34375)
    assert d["pass@1"]["std"] == pytest.approx(math.sqrt(2 * 0.09375 ** 2))  # sample std of two values
    # pass@4 per repeat: prompts with >= 1 success: 3/4 then 3/4
    assert d["pass@4"]["per_repeat"] == pytest.approx([0.75, 0.75])
    assert d["verify_no_answer"] == 2
    assert d["truncated_frac"] == pytest.approx(1 / 32)
    # one dataset: the macro average is that dataset
    assert res["macro"]["pass@1"]["mean"] == pytest.approx(0.34375)
    # files: responses kept with grades, results json + markdown
    recs = read_records(tmp_path / "toy" / "repeat_0.jsonl")
    assert [r.id for r in recs.values()] == ["p1", "p2", "p3", "p4"]
    assert recs["p1"].responses == TEXTS[0]["1+1"] and recs["p1"].rewards == [1.0, 0.0, 0.0, 1.0]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["datasets"]["toy"]["pass@1"]["mean"] == pytest.approx(0.34375)
    md = (tmp_path / "results.md").read_text()
    assert "| toy | 4 | 34.38 ± 13.26 |" in md


class HalfGrader(ExactGrader):
    """A continuous reward: 1 for the right box, 0.5 for a wrong one, 0 without a box."""

    def grade(self, responses, answers, progress=False, completion_ids=None):
        rewards, statuses = super().grade(responses, answers, progress, completion_ids)
        return [1.0 if r == 1.0 else 0.5 if s == "ok" else 0.0 for r, s in zip(rewards, statuses)], statuses


@pytest.mark.parametrize("threshold, pass1, all_fail", [(0.5, 0.4375, 0.25), (0.25, 0.875, 0.0)])
def test_pass_at_1_counts_successes_at_the_threshold_and_the_mean_reward_is_beside_it(tmp_path, threshold, pass1, all_fail):
    # repeat 0 graded by HalfGrader: p1 [1, .5, 0, 1], p2 [.5, .5, .5, .5], p3 [1, 1, 1, 1], p4 [1, .5, .5, 0].
    # At 0.5 (0.5 is not above it): successes 2, 0, 4, 1 -> pass@1 (2 + 0 + 4 + 1) / 16 = 0.4375; p2 all-fail: 1/4.
    # At 0.25: successes 3, 4, 4, 3 -> 14 / 16 = 0.875; no all-fail prompt.
    # Mean reward either way: (2.5/4 + 2/4 + 4/4 + 2/4) / 4 = (0.625 + 0.5 + 1 + 0.5) / 4 = 0.65625.
    res = evaluate(FakePolicy(TEXTS), {"toy": PROMPTS}, HalfGrader(), tmp_path, protocol(batch_size=8), progress=False,
                   success_threshold=threshold)
    d = res["datasets"]["toy"]
    assert d["pass@1"]["mean"] == pytest.approx(pass1) and d["all_fail_frac"]["mean"] == pytest.approx(all_fail)
    assert d["reward_mean"]["mean"] == pytest.approx(0.65625) and res["macro"]["reward_mean"]["mean"] == pytest.approx(0.65625)
    assert res["protocol"]["success_threshold"] == threshold
    row = next(x for x in (tmp_path / "results.md").read_text().splitlines() if x.startswith("| toy |"))
    assert row.startswith(f"| toy | 4 | {100 * pass1:.2f} ± 0.00 |") and "| 0.656 ± 0.000 |" in row


def test_macro_average_is_per_repeat_mean_over_datasets(tmp_path):
    texts = {0: {**TEXTS[0]}, 1: {**TEXTS[1]}}
    pol = FakePolicy(texts)
    res = evaluate(pol, {"a": PROMPTS[:2], "b": PROMPTS[2:]}, ExactGrader(), tmp_path, protocol(batch_size=4), repeats=2,
                   progress=False)
    # a: r0 (0.5 + 0)/2 = 0.25, r1 (0.25 + 0.25)/2 = 0.25 ; b: r0 (1 + 0.25)/2 = 0.625, r1 (0.5 + 0)/2 = 0.25
    assert res["datasets"]["a"]["pass@1"]["per_repeat"] == pytest.approx([0.25, 0.25])
    assert res["datasets"]["b"]["pass@1"]["per_repeat"] == pytest.approx([0.625, 0.25])
    assert res["macro"]["pass@1"]["per_repeat"] == pytest.approx([0.4375, 0.25])
    assert "macro average" in (tmp_path / "results.md").read_text()


def test_resume_after_kill_regenerates_only_missing_prompts(tmp_path):
    full = FakePolicy(TEXTS)
    ref = evaluate(full, {"toy": PROMPTS}, ExactGrader(), tmp_path / "ref", protocol(batch_size=4), repeats=1, progress=False)
    assert full.calls == 4  # batch_size 4 / n 4 -> one prompt per generate call

    # killed during the 3rd generate call: 2 prompts are on disk
    out = tmp_path / "killed"
    killed = FakePolicy(TEXTS, fail_on_call=3)
    with pytest.raises(KeyboardInterrupt):
        evaluate(killed, {"toy": PROMPTS}, ExactGrader(), out, protocol(batch_size=4), progress=False)
    path = out / "toy" / "repeat_0.jsonl"
    assert len(read_records(path)) == 2
    # ... and the kill tore the last line in half
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + lines[1][: len(lines[1]) // 2])
    assert list(read_records(path)) == ["p1"]

    again = FakePolicy(TEXTS)
    res = evaluate(again, {"toy": PROMPTS}, ExactGrader(), out, protocol(batch_size=4), progress=False)
    assert again.generated == ["2+2", "3+3", "4+4"]  # p1 was not regenerated
    assert again.calls == 3
    assert res["datasets"]["toy"]["pass@1"]["mean"] == pytest.approx(ref["datasets"]["toy"]["pass@1"]["mean"])
    assert len(path.read_text().splitlines()) == 4
    # a finished evaluation re-run generates nothing
    idle = FakePolicy(TEXTS)
    evaluate(idle, {"toy": PROMPTS}, ExactGrader(), out, protocol(batch_size=4), progress=False)
    assert idle.calls == 0


def test_resume_with_other_settings_is_refused(tmp_path):
    evaluate(FakePolicy(TEXTS), {"toy": PROMPTS[:1]}, ExactGrader(), tmp_path, protocol(batch_size=4), progress=False)
    with pytest.raises(EvalError, match="temperature"):
        evaluate(FakePolicy(TEXTS), {"toy": PROMPTS[:1]}, ExactGrader(), tmp_path, protocol(temperature=1.0, batch_size=4),
                 progress=False)


def test_corrupt_middle_line_is_an_error(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"id": "a"\n{"id": "b", "answer": "1", "rewards": [], "statuses": [], "finished": [], '
                 '"num_tokens": [], "responses": []}\n')
    with pytest.raises(EvalError, match=":1:"):
        read_records(p)


def test_evaluate_during_training_uses_eval_config():
    res = evaluate_during_training(FakePolicy(TEXTS, seed=7), {"val": PROMPTS}, ExactGrader(), EvalConfig(n=4),
                                   max_new_tokens=16, seed=7, batch_size=8)
    assert res == {"val/pass@1": pytest.approx(0.4375), "val/reward_mean": pytest.approx(0.4375)}   # 0/1 rewards
    res = evaluate_during_training(FakePolicy(TEXTS, seed=7), PROMPTS, ExactGrader(), EvalConfig(n=4, repeats=2),
                                   max_new_tokens=16, seed=7, batch_size=8)
    assert res["val/pass@1"] == pytest.approx(0.34375) and "val/pass@1_std" in res


def test_best_checkpoint_rule():
    hist = [{"step": 5, "k": 0.3}, {"step": 10, "k": 0.5}, {"step": 15, "k": 0.5}, {"step": 20, "k": None},
            {"step": 25}, {"step": 30, "k": float("nan")}]
    assert best_checkpoint(hist, "k") == 10  # tie between 10 and 15 -> earlier step
    assert best_checkpoint(hist, "k", steps={15, 20}) == 15
    assert best_checkpoint(hist, "missing") is None


def test_parse_data_args(tmp_path):
    (tmp_path / "math500.jsonl").write_text("")
    specs = parse_data_args(["math500", "mine=/x/y.jsonl", "/a/b/val-set.parquet", "arithmetic"], tmp_path)
    assert specs == {"math500": str(tmp_path / "math500.jsonl"), "mine": "/x/y.jsonl",
                     "val-set": "/a/b/val-set.parquet", "arithmetic": "arithmetic"}
    with pytest.raises(EvalError, match="aime24"):
        parse_data_args(["aime24"], tmp_path)
    with pytest.raises(EvalError, match="twice"):
        parse_data_args(["math500", "math500=/z.jsonl"], tmp_path)


def test_vllm_backend_explains_why_it_cannot_run(monkeypatch):
    from graft.commands.eval_cli import engine_sampler
    from graft.config import ModelConfig

    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(EvalError, match="backend vllm: .*not installed"):
        engine_sampler("vllm", ModelConfig(name="m", path="/models/m"), None, "cpu")


def test_vllm_backend_with_fake_vllm(monkeypatch):
    """--backend vllm of a folder samples through graft's VllmEngine: per-sample seeds as in training, the
    model's stop strings cut the samples (here "\\boxed{" ends nothing; "..." would), the codec decodes."""
    from graft.config import ModelConfig
    from graft.policy import engines
    from graft.seeds import sample_seed

    calls = {}
    PROBLEMS = [p.problem for p in PROMPTS]

    class LLM:
        def __init__(self, **kw):
            calls["init"] = kw

        def generate(self, requests, params, use_tqdm=False):
            calls["params"] = params
            outs, seen = [], {}
            for req in requests:   # one request per sample: token ids [prompt index, sample index]
                i = req["prompt_token_ids"][0]
                j = seen[i] = seen.get(i, -1) + 1
                outs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(
                    token_ids=[i, j], logprobs=None, finish_reason="stop")]))
            return outs

    class SamplingParams:
        def __init__(self, **kw):
            self.kw = kw

    class Codec:
        cfg = ModelConfig(name="m", path="/models/x", template="plain", stop=["STOP"])
        stops, stop_ids = ("STOP",), {99}

        def encode_prompt(self, problem, messages=None):
            return [PROBLEMS.index(problem)]

        def decode(self, ids):   # the text appears with the second token; sample 0 runs on past a stop string
            if len(ids) < 2:
                return ""
            return TEXTS[0][PROBLEMS[ids[0]]][ids[1]] + (" STOP \\boxed{0}" if ids[1] == 0 else "")

        def cut(self, sample, stops=None):
            from graft.policy.prompts import cut_at_stop
            return cut_at_stop(sample, self.decode, self.stops if stops is None else stops)

    fake = types.ModuleType("vllm")
    fake.LLM, fake.SamplingParams = LLM, SamplingParams
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setattr(engines, "vllm_unavailable_reason", lambda: None)
    sampler = engines.VllmEngine(None, folder="/models/x", codec=Codec())
    res = evaluate(sampler, {"toy": PROMPTS}, ExactGrader(), None, protocol(max_new_tokens=32), backend="vllm", progress=False)
    assert res["datasets"]["toy"]["pass@1"]["mean"] == pytest.approx(0.4375)   # the \\boxed{0} after STOP is cut
    assert calls["init"]["model"] == "/models/x"
    params = calls["params"]  # one SamplingParams per sample, each with its own seed
    assert len(params) == 4 * len(PROMPTS)
    kw = params[0].kw
    assert (kw["n"], kw["temperature"], kw["top_p"], kw["max_tokens"], kw["stop_token_ids"]) == (1, 0.6, 0.95, 32, [99])
    want = [sample_seed(derive_seed(0, 0, p.id), j) % (2**31) for p in PROMPTS for j in range(4)]
    assert [p.kw["seed"] for p in params] == want


def test_vllm_rejects_gguf(monkeypatch):
    from graft.policy import engines

    monkeypatch.setattr(engines, "vllm_unavailable_reason", lambda: None)
    with pytest.raises(engines.EngineUnavailable, match="Hugging Face model folder"):
        engines.VllmEngine(None, folder="embedded:gemma3-270m", codec=FakePolicy(TEXTS))


def test_real_grader_hand_computed_pass_at_1(tmp_path):
    from graft.reward.grader import Grader

    texts = {0: {"1+1": ["\\boxed{2}", "\\boxed{3}", "I think 2", "\\boxed{2.0}"],       # 2/4 ("I think 2": no box)
                 "2+2": ["\\boxed{\\frac{8}{2}}", "\\boxed{4}", "\\boxed{5}", "\\boxed{4}"],  # 3/4
                 "3+3": ["\\boxed{7}"] * 4}}                                              # 0/4
    pol = FakePolicy(texts)
    with Grader(timeout_s=5, workers=0) as grader:
        res = evaluate(pol, {"toy": PROMPTS[:3]}, grader, tmp_path, protocol(batch_size=8), progress=False)
    assert res["datasets"]["toy"]["pass@1"]["mean"] == pytest.approx((2 / 4 + 3 / 4 + 0) / 3)
    assert res["datasets"]["toy"]["verify_no_answer"] == 1
    rec = read_records(tmp_path / "toy" / "repeat_0.jsonl")["p1"]
    assert rec.rewards == [1.0, 0.0, 0.0, 1.0] and rec.statuses[2] == "no_answer"


def test_changed_reference_answer_is_regraded_not_regenerated(tmp_path):
    evaluate(FakePolicy(TEXTS), {"toy": PROMPTS}, ExactGrader(), tmp_path, protocol(batch_size=16), progress=False)
    fixed = [Prompt("p2", "2+2", "5")] + [p for p in PROMPTS if p.id != "p2"]
    pol = FakePolicy(TEXTS)
    res = evaluate(pol, {"toy": fixed}, ExactGrader(), tmp_path, protocol(batch_size=16), progress=False)
    assert pol.calls == 0
    # p2's four "\boxed{5}" responses are now correct: (1 + 0.5 + 1 + 0.25) / 4
    assert res["datasets"]["toy"]["pass@1"]["mean"] == pytest.approx(2.75 / 4)
    assert read_records(tmp_path / "toy" / "repeat_0.jsonl")["p2"].rewards == [1.0] * 4


class SeededPolicy(FakePolicy):
    """A sampler that takes one seed per prompt (like Policy.generate): records them."""

    def __init__(self):
        super().__init__({0: TEXTS[0]})
        self.seen: dict[str, int] = {}

    def generate(self, prompt_ids, params, progress=False, desc=None):
        self.calls += 1
        for (idx,), s in zip(prompt_ids, params.seeds):
            self.seen[self.problems[idx]] = s
        return [[FakeSample([1], [], t, True) for t in TEXTS[0][self.problems[idx]]] for (idx,) in prompt_ids]


def test_per_prompt_seeds_do_not_depend_on_chunking():
    small, big = SeededPolicy(), SeededPolicy()
    evaluate(small, {"toy": PROMPTS}, ExactGrader(), None, protocol(batch_size=4), progress=False)   # 1 prompt per call
    evaluate(big, {"toy": PROMPTS}, ExactGrader(), None, protocol(batch_size=64), progress=False)    # all in one call
    assert (small.calls, big.calls) == (4, 1)
    assert small.seen == big.seen
    assert small.seen["1+1"] == derive_seed(0, 0, "p1") and len(set(small.seen.values())) == 4


def test_vllm_for_in_memory_policy_needs_vllm(monkeypatch):
    from graft.policy.engines import EngineUnavailable, make_engine

    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(EngineUnavailable, match="not installed"):
        make_engine("vllm", FakePolicy(TEXTS))


def test_eval_samples_are_cut_at_stop_strings_like_rollouts(tiny_llama_dir, tmp_path):
    """issue 10 item 1: evaluation samples through the rollout engine, so a response ends at the model's
    stop string (a few-shot base model's invented next problem is never graded), and eval samples equal
    the engine's samples for the same seeds."""
    from graft.config import ModelConfig
    from graft.policy.engines import make_engine
    from graft.policy.policy import Policy

    stops = ["e"]   # a letter a random model writes within a few tokens, so many samples are cut
    pol = Policy.load(ModelConfig(name="A", path=tiny_llama_dir, template="plain", stop=stops))
    prompts = [Prompt(f"q{i}", f"What is {i} + 1?", str(i + 1)) for i in range(3)]
    res = evaluate(make_engine("hf", pol), {"toy": prompts}, ExactGrader(), tmp_path,
                   protocol(max_new_tokens=12, batch_size=8, seed=5), repeats=1, progress=False)
    records = read_records(tmp_path / "toy" / "repeat_0.jsonl")
    responses = [t for r in records.values() for t in r.responses]
    assert res["datasets"]["toy"]["num_prompts"] == 3 and len(responses) == 12
    assert not any("e" in t for t in responses)
    cut = sum(f and n < 12 for r in records.values() for f, n in zip(r.finished, r.num_tokens))
    assert cut >= 3   # ended by the stop string, not by max_new_tokens
    engine = make_engine("hf", pol)
    for p in prompts:
        (group,) = engine.generate([pol.codec.encode_prompt(p.problem)], SamplingParams(
            n=4, max_new_tokens=12, temperature=0.6, top_p=0.95, seeds=[derive_seed(5, 0, p.id)]))
        assert [s.text for s in group] == records[p.id].responses
