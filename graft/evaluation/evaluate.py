"""pass@k of a :class:`~graft.policy.engines.Sampler` under the spec §5 protocol (the command: :mod:`graft.commands.eval_cli`).

Protocol (defaults): temperature 0.6, top-p 0.95, ``n = 8`` samples per prompt, graded by
the training grader (math_verify with a hard timeout). pass@1 of one repeat is the mean over
prompts of the fraction of correct samples; pass@k uses the unbiased estimator. ``repeats``
independent runs (different sampling seeds) are reported as mean ± sample std (ddof 1).
The macro average over datasets is computed per repeat, then mean ± std over repeats (the
paper's "average over the five benchmarks"). Scores are fractions in [0, 1] in JSON and
percentages in the markdown table.

Files under ``out_dir``::

    protocol.json              n, temperature, top_p, max_new_tokens, seed (a resumed run must match)
    DATASET/repeat_R.jsonl     one line per prompt: id, answer, rewards, statuses, finished,
                               num_tokens, responses (so every grade can be re-checked)
    results.json               per dataset and macro: pass@k mean/std/per-repeat, lengths, verifier counts
    results.md                 the same as a markdown table

Resuming: lines are appended (flushed and fsynced) after each prompt chunk is generated and
graded. A re-run with the same ``out_dir`` reads the finished prompts back, drops a torn last
line, and generates only the missing prompts (a changed reference answer is regraded from the
stored responses). Every prompt samples with its own seed ``derive_seed(seed, repeat, prompt_id)``
(samplers that take per-prompt ``seeds``, as ``Policy.generate`` and the vLLM backend do), so a
resumed run gives exactly the samples of an uninterrupted one, whatever the batch size or chunking.

Backends: all sample through :mod:`graft.policy.engines`, the rollout engines of training, so an
evaluated sample ends at the model's stop strings exactly as a rollout does: ``hf`` (the training
sampler, CPU or GPU), ``hf-bf16`` (the same over a bf16 copy of the weights: ~2x the tokens/s of
fp32 on CPUs with bf16 matmuls; the samples are the bf16 model's, which differs from the fp32 one by
~0.01 nats per token on average) and ``vllm`` (all samples of a chunk in one vLLM call, from the
model folder; GPU only; ``pip install 'graft[vllm]'``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

from tqdm.auto import tqdm

from graft.config import EvalConfig, RewardConfig
from graft.console import bars
from graft.evaluation.metrics import mean_std, num_correct, pass_at_k_from_rewards
from graft.files import write_text, writing
from graft.policy.engines import Sampler
from graft.policy.sampling import SamplingParams, eval_sampling
from graft.seeds import derive_seed
from graft.storage.checkpoint import (
    CheckpointError,
    checkpoint_step,
    list_checkpoints,
    load_checkpoint,
)
from graft.types import VERIFY_NO_ANSWER, VERIFY_TIMEOUT, Prompt

log = logging.getLogger(__name__)

PROTOCOL_KEYS = ("n", "temperature", "top_p", "max_new_tokens", "seed")
"""Settings that must agree between a run and the files it resumes."""

_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


DEFAULT_MAX_NEW_TOKENS = 2048
"""Response limit of ``graft eval`` when neither ``--max-new-tokens`` nor the run's config gives one."""


class EvalError(RuntimeError):
    """An evaluation that cannot run or resume; the message says why."""


# ----------------------------------------------------------------------------- records


@dataclass
class PromptRecord:
    """The graded samples of one prompt in one repeat (one line of ``repeat_R.jsonl``)."""

    id: str
    answer: str
    rewards: list[float]
    statuses: list[str]
    finished: list[bool]
    num_tokens: list[int]
    responses: list[str]

    def to_json(self) -> str:
        return json.dumps(
            {
                "id": self.id,
                "answer": self.answer,
                "rewards": self.rewards,
                "statuses": self.statuses,
                "finished": self.finished,
                "num_tokens": self.num_tokens,
                "responses": self.responses,
            },
            ensure_ascii=False,
        )

    @classmethod
    def from_dict(cls, d: dict) -> "PromptRecord":
        return cls(
            id=str(d["id"]),
            answer=str(d["answer"]),
            rewards=[float(r) for r in d["rewards"]],
            statuses=list(d["statuses"]),
            finished=[bool(f) for f in d["finished"]],
            num_tokens=[int(t) for t in d["num_tokens"]],
            responses=list(d["responses"]),
        )


def read_records(path: Path, repair: bool = False) -> dict[str, PromptRecord]:
    """Records of a ``repeat_R.jsonl`` file by prompt id.

    A torn last line (a kill while writing) is ignored, and with ``repair`` cut off the file so
    appending continues on a clean line. A malformed line elsewhere is an :class:`EvalError`.
    """
    path = Path(path)
    if not path.exists():
        return {}
    data = path.read_bytes()
    out: dict[str, PromptRecord] = {}
    good_end = 0  # byte offset after the last complete line
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        end = good_end + len(raw) + 1
        if end > len(data):  # no newline: a torn last line (or nothing)
            break
        if raw.strip():
            try:
                rec = PromptRecord.from_dict(json.loads(raw))
            except (ValueError, KeyError, TypeError) as e:
                if end == len(data):
                    break  # torn last line that happens to end in a newline
                raise EvalError(
                    f"{path}:{lineno}: malformed record ({e}); delete the line or the file to regenerate it"
                ) from None
            out[rec.id] = rec
        good_end = end
    if repair and good_end < len(data):
        with open(path, "r+b") as f:
            f.truncate(good_end)
    return out


def _append(path: Path, records: Iterable[PromptRecord]) -> None:
    with writing(path), open(path, "a", encoding="utf-8") as f:
        for rec in records:
            f.write(rec.to_json() + "\n")
        f.flush()
        os.fsync(f.fileno())


# ----------------------------------------------------------------------------- generation


def check_name(name: str) -> None:
    if not _NAME_RE.match(name):
        raise EvalError(f"dataset name {name!r} must use only letters, digits, '_', '.', '-' (it is a folder name)")


def _check_protocol(out_dir: Path, protocol: dict) -> None:
    path = out_dir / "protocol.json"
    if path.exists():
        old = json.loads(path.read_text())
        diff = [k for k in PROTOCOL_KEYS if old.get(k) != protocol.get(k)]
        if diff:
            raise EvalError(
                f"{out_dir} holds an evaluation with different settings "
                + ", ".join(f"{k}: {old.get(k)!r} -> {protocol.get(k)!r}" for k in diff)
                + "; use another --out or delete it"
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(protocol, indent=2) + "\n")  # repeats/backend/model of the latest call


def run_repeat(
    sampler: Sampler,
    prompts: Sequence[Prompt],
    grader,
    *,
    path: Path | None,
    params: SamplingParams,
    repeat: int,
    chunk_prompts: int,
    progress: bool = False,
    desc: str = "",
) -> list[PromptRecord]:
    """Generate and grade ``params.n`` samples for every prompt (one repeat); returns records in prompt order.

    With ``path``, finished prompts are read back from it and new ones appended per chunk. A
    stored prompt whose reference answer differs from ``prompts`` is regraded (not regenerated).
    Seeds: one per prompt, ``derive_seed(params.seed, repeat, prompt_id)``, so a prompt's samples do not depend
    on chunking, batch size, ``--limit`` or resuming (a sampler that takes one seed per call gets
    ``derive_seed(params.seed, repeat, chunk start)``).
    """
    n, seed = params.n, params.seed
    done = _resumed(path, prompts, grader, n, desc)
    bar = _bar(len(prompts), sum(1 for p in prompts if p.id in done), desc, progress)
    try:
        for start in range(0, len(prompts), chunk_prompts):
            todo = [p for p in prompts[start : start + chunk_prompts] if p.id not in done]
            if not todo:
                continue
            chunk = replace(
                params, seed=derive_seed(seed, repeat, start), seeds=tuple(derive_seed(seed, repeat, p.id) for p in todo)
            )
            samples = sampler.generate([list(sampler.codec.encode_prompt(p.problem, p.messages)) for p in todo], chunk, desc=desc)
            if len(samples) != len(todo) or any(len(s) != n for s in samples):
                raise EvalError(f"generator returned {[len(s) for s in samples]} samples for {len(todo)} prompts x n={n}")
            new = _graded(todo, samples, grader, n)
            if path is not None:
                _append(path, new)
            done.update((r.id, r) for r in new)
            bar.update(len(todo))
    finally:
        bar.close()
    return [done[p.id] for p in prompts]


def _resumed(path: Path | None, prompts: Sequence[Prompt], grader, n: int, desc: str) -> dict[str, PromptRecord]:
    """The finished prompts of a repeat: read back from ``path`` (none without), checked against ``n`` samples
    and ``prompts``' unique ids, those whose reference answer changed regraded (and appended)."""
    done = read_records(path, repair=True) if path is not None else {}
    for rec in done.values():
        if len(rec.rewards) != n:
            raise EvalError(f"{path}: prompt {rec.id} has {len(rec.rewards)} samples, this evaluation uses n={n}")
    if len({p.id for p in prompts}) != len(prompts):
        raise EvalError(f"{desc or 'dataset'}: prompt ids are not unique")
    fixed = _regraded([p for p in prompts if p.id in done and done[p.id].answer != p.answer], done, grader)
    if fixed and path is not None:
        _append(path, fixed)  # a later line for the same id replaces the earlier one
    done.update((r.id, r) for r in fixed)
    return done


def _regraded(stale: list[Prompt], done: dict[str, PromptRecord], grader) -> list[PromptRecord]:
    """The stored responses of prompts whose reference answer changed, graded against the new answer."""
    if not stale:
        return []
    texts = [t for p in stale for t in done[p.id].responses]
    answers = [p.answer for p in stale for _ in done[p.id].responses]
    rewards, statuses = grader.grade(texts, answers, progress=False)
    fixed, i = [], 0
    for p in stale:
        old, k = done[p.id], len(done[p.id].responses)
        fixed.append(
            PromptRecord(
                id=p.id,
                answer=p.answer,
                rewards=[float(r) for r in rewards[i : i + k]],
                statuses=list(statuses[i : i + k]),
                finished=old.finished,
                num_tokens=old.num_tokens,
                responses=old.responses,
            )
        )
        i += k
    return fixed


def _graded(todo: list[Prompt], samples: list[list], grader, n: int) -> list[PromptRecord]:
    texts = [s.text for group in samples for s in group]
    answers = [p.answer for p in todo for _ in range(n)]
    ids = [s.token_ids for group in samples for s in group]
    rewards, statuses = grader.grade(texts, answers, progress=False, completion_ids=ids)
    out = []
    for i, (p, group) in enumerate(zip(todo, samples, strict=True)):  # a group of samples per prompt
        sl = slice(i * n, (i + 1) * n)
        out.append(
            PromptRecord(
                id=p.id,
                answer=p.answer,
                rewards=[float(r) for r in rewards[sl]],
                statuses=list(statuses[sl]),
                finished=[bool(s.finished) for s in group],
                num_tokens=[len(s.token_ids) for s in group],
                responses=[s.text for s in group],
            )
        )
    return out


def _bar(total: int, initial: int, desc: str, enabled: bool):
    """A tqdm bar on a terminal with ``progress``; else :class:`_Lines`."""
    if enabled and bars():
        return tqdm(total=total, initial=initial, desc=desc, unit="prompt", dynamic_ncols=True)
    return _Lines(total, initial, desc)


class _Lines:
    """Progress without a bar: an INFO line (``graft -v``) at most every ``every_s`` seconds, and one at the end."""

    def __init__(self, total: int, initial: int, desc: str, every_s: float = 30.0) -> None:
        self.total, self.n, self.desc, self.every_s = total, initial, desc or "evaluation", every_s
        self.start = self.last = time.monotonic()

    def update(self, k: int) -> None:
        self.n += k
        if time.monotonic() - self.last >= self.every_s:
            self._line()

    def close(self) -> None:
        self._line()

    def _line(self) -> None:
        self.last = time.monotonic()
        log.info("%s: %d/%d prompts (%.0f s)", self.desc, self.n, self.total, self.last - self.start)


# ----------------------------------------------------------------------------- results


def default_ks(n: int) -> list[int]:
    """pass@k reported for k = 1, 2, 4, ... up to n, and n itself."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if n not in ks:
        ks.append(n)
    return ks


def _stat(per_repeat: list[float]) -> dict:
    m, s = mean_std(per_repeat)
    return {"mean": m, "std": s, "per_repeat": per_repeat}


def mean_reward(records: Sequence[PromptRecord]) -> float:
    """Mean over prompts of each prompt's mean reward (pass@1's average, of the rewards themselves); NaN without
    prompts. Hand-worked: rewards [1, 0] and [0.5, 0.5] -> (0.5 + 0.5) / 2 = 0.5."""
    means = [sum(r.rewards) / len(r.rewards) for r in records if r.rewards]
    return sum(means) / len(means) if means else math.nan


def summarize(records: dict[str, list[list[PromptRecord]]], ks: Sequence[int], threshold: float) -> dict:
    """Per-dataset and macro statistics from ``records[dataset][repeat] = [PromptRecord]``: pass@k and the all-fail
    share (a success being a reward above ``threshold``, ``reward.success_threshold``) and the mean reward
    (:func:`mean_reward`), each as mean ± std over repeats."""
    datasets: dict[str, dict] = {}
    for name, repeats in records.items():
        entry: dict[str, Any] = {"num_prompts": len(repeats[0]) if repeats else 0, "repeats": len(repeats)}
        for k in ks:
            entry[f"pass@{k}"] = _stat([pass_at_k_from_rewards([r.rewards for r in rep], k, threshold) for rep in repeats])
        entry["reward_mean"] = _stat([mean_reward(rep) for rep in repeats])
        flat = [(t, f, s) for rep in repeats for r in rep for t, f, s in zip(r.num_tokens, r.finished, r.statuses, strict=True)]
        entry["response_tokens_mean"] = sum(t for t, _, _ in flat) / len(flat) if flat else math.nan
        entry["truncated_frac"] = sum(not f for _, f, _ in flat) / len(flat) if flat else math.nan
        entry["verify_timeouts"] = sum(s == VERIFY_TIMEOUT for _, _, s in flat)
        entry["verify_no_answer"] = sum(s == VERIFY_NO_ANSWER for _, _, s in flat)
        entry["all_fail_frac"] = _stat(
            [sum(num_correct(r.rewards, threshold) == 0 for r in rep) / len(rep) if rep else math.nan for rep in repeats]
        )
        datasets[name] = entry
    macro: dict[str, Any] = {"datasets": list(datasets)}
    num_repeats = min((d["repeats"] for d in datasets.values()), default=0)
    for key in [f"pass@{k}" for k in ks] + ["reward_mean"]:
        per_repeat = (
            [sum(d[key]["per_repeat"][r] for d in datasets.values()) / len(datasets) for r in range(num_repeats)]
            if datasets
            else []
        )
        macro[key] = _stat(per_repeat)
    return {"datasets": datasets, "macro": macro}


def pct(stat: dict) -> str:
    m, s = stat["mean"], stat["std"]
    if m is None or (isinstance(m, float) and math.isnan(m)):
        return "n/a"
    return f"{100 * m:.2f} ± {100 * s:.2f}"


def mean_pm(stat: dict) -> str:
    """A mean ± std over repeats as it is (a mean reward: ``0.625 ± 0.125``); ``n/a`` without a mean."""
    m, s = stat["mean"], stat["std"]
    if m is None or (isinstance(m, float) and math.isnan(m)):
        return "n/a"
    return f"{m:.3f} ± {s:.3f}"


def results_markdown(results: dict) -> str:
    """Markdown table of ``results`` (percentages, mean ± std over repeats)."""
    proto = results["protocol"]
    ks = results["ks"]
    show = sorted({1, proto["n"]} & set(ks))
    lines = [
        f"# Evaluation: {proto.get('model') or 'model'}",
        "",
        f"temperature {proto['temperature']}, top-p {proto['top_p']}, n = {proto['n']} samples per prompt, "
        f"max {proto['max_new_tokens']} new tokens, {proto['repeats']} repeat(s) (mean ± sample std), "
        f"backend {proto['backend']}, seed {proto['seed']}; a success is a reward above "
        f"{proto.get('success_threshold')}.",
        "",
        "| dataset | prompts | "
        + " | ".join(f"pass@{k} (%)" for k in show)
        + " | mean reward | all-fail (%) | mean tokens | truncated (%) | verify timeouts |",
        "|---|---:|" + "---:|" * len(show) + "---:|---:|---:|---:|---:|",
    ]
    for name, d in results["datasets"].items():
        lines.append(
            f"| {name} | {d['num_prompts']} | "
            + " | ".join(pct(d[f"pass@{k}"]) for k in show)
            + f" | {mean_pm(d['reward_mean'])} | {pct(d['all_fail_frac'])} | {_fmt(d['response_tokens_mean'], '.0f')}"
            + f" | {_fmt(100 * d['truncated_frac'], '.1f')} | {d['verify_timeouts']} |"
        )
    if len(results["datasets"]) > 1:
        m = results["macro"]
        lines.append(
            f"| **macro average** | {len(results['datasets'])} sets | "
            + " | ".join(f"**{pct(m[f'pass@{k}'])}**" for k in show)
            + f" | **{mean_pm(m['reward_mean'])}** | | | | |"
        )
    return "\n".join(lines) + "\n"


def _fmt(v, spec: str) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def json_clean(obj):
    """Replace NaN/inf by None recursively so the JSON is standard."""
    if isinstance(obj, float):
        return None if (math.isnan(obj) or math.isinf(obj)) else obj
    if isinstance(obj, dict):
        return {k: json_clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_clean(v) for v in obj]
    return obj


# ----------------------------------------------------------------------------- entry points


def evaluate(
    sampler: Sampler,
    datasets: dict[str, list[Prompt]],
    grader,
    out_dir: str | Path | None,
    params: SamplingParams,
    repeats: int = EvalConfig.repeats,
    backend: str = "hf",
    progress: bool = True,
    ks: Sequence[int] | None = None,
    chunk_prompts: int | None = None,
    model_label: str | None = None,
    success_threshold: float = RewardConfig.success_threshold,
) -> dict:
    """Evaluate ``sampler`` (a :class:`~graft.policy.engines.Sampler`: a rollout engine, or a Learner) on every
    dataset with the spec §5 protocol, sampling with ``params`` (n, temperature, top_p, max_new_tokens, the
    evaluation seed, batch_size; :func:`graft.policy.sampling.eval_sampling` reads them off the config); returns
    the results dict.

    ``grader.grade(texts, answers, progress=False) -> (rewards, statuses)``. With ``out_dir`` (None keeps
    everything in memory) responses, ``results.json`` and ``results.md`` are written and a killed evaluation
    resumes. ``backend`` names the sampler's engine in ``protocol.json``; ``chunk_prompts`` (prompts per generate
    call and per append) defaults to ``max(1, params.batch_size // params.n)`` for hf engines and 256 for vllm.
    ``success_threshold``: a reward above it is a success (pass@k; the run's ``reward.success_threshold``); it is
    recorded in the protocol but not part of what a resumed evaluation must agree on (the rewards are kept, the
    counts recomputed).
    """
    n = params.n
    if repeats < 1:
        raise EvalError(f"repeats must be >= 1, got {repeats}")
    ks = sorted({k for k in (ks or default_ks(n)) if 1 <= k <= n} | {1})
    if chunk_prompts is None:  # hf: one generate call of batch_size sequences; vLLM: large calls
        chunk_prompts = 256 if backend == "vllm" else max(1, params.batch_size // n)
    for name in datasets:
        check_name(name)
    protocol = {
        "n": n,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_new_tokens": params.max_new_tokens,
        "seed": params.seed,
        "repeats": repeats,
        "backend": backend,
        "model": model_label,
        "verify_fn": getattr(grader, "verify_fn", None),
        "success_threshold": success_threshold,
    }
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        _check_protocol(out, protocol)
    records = _all_repeats(sampler, datasets, grader, out, params, repeats, chunk_prompts, progress)
    results = {"protocol": protocol, "ks": ks, **summarize(records, ks, success_threshold)}
    if out is not None:
        write_text(out / "results.json", json.dumps(json_clean(results), indent=2) + "\n")
        write_text(out / "results.md", results_markdown(results))
    return results


def _all_repeats(
    sampler: Sampler,
    datasets: dict[str, list[Prompt]],
    grader,
    out: Path | None,
    params: SamplingParams,
    repeats: int,
    chunk_prompts: int,
    progress: bool,
) -> dict[str, list[list[PromptRecord]]]:
    """Every dataset's ``repeats`` repeats (:func:`run_repeat` with ``params``), each kept in
    ``out/DATASET/repeat_R.jsonl`` when ``out`` is given."""
    records: dict[str, list[list[PromptRecord]]] = {}
    for name, prompts in datasets.items():
        records[name] = []
        for r in range(repeats):
            path = None
            if out is not None:
                (out / name).mkdir(parents=True, exist_ok=True)
                path = out / name / f"repeat_{r}.jsonl"
            records[name].append(
                run_repeat(
                    sampler,
                    prompts,
                    grader,
                    path=path,
                    params=params,
                    repeat=r,
                    chunk_prompts=chunk_prompts,
                    progress=progress,
                    desc=f"{name} r{r}",
                )
            )
    return records


def evaluate_during_training(
    sampler: Sampler,
    datasets: dict[str, list[Prompt]] | list[Prompt],
    grader,
    eval_cfg: EvalConfig,
    *,
    max_new_tokens: int,
    seed: int = 0,
    batch_size: int = 64,
    out_dir: str | Path | None = None,
    model_label: str | None = None,
    success_threshold: float = RewardConfig.success_threshold,
) -> dict[str, float]:
    """:func:`evaluate` with ``eval_cfg``'s settings (n, temperature, top_p, repeats;
    :func:`graft.policy.sampling.eval_sampling`), for the trainer; returns ``{"DATASET/pass@1": x, ...}``.

    A bare list of prompts is named ``val``. Also returns ``DATASET/reward_mean`` (:func:`mean_reward`),
    ``DATASET/pass@1_std`` when ``repeats > 1`` and ``macro/pass@1`` when several datasets are given. A fixed
    ``seed`` across steps (common random numbers) makes checkpoints more comparable than a per-step seed.
    ``out_dir`` (e.g. ``RUN_DIR/eval/step_000010/A``) keeps the graded responses; None keeps nothing on disk. The
    trainer logs the values as ``eval/M/DATASET/pass@1``; pick the best step with :func:`best_checkpoint`.
    """
    if not isinstance(datasets, dict):
        datasets = {"val": list(datasets)}
    res = evaluate(
        sampler,
        datasets,
        grader,
        out_dir,
        eval_sampling(eval_cfg, max_new_tokens, seed=seed, batch_size=batch_size),
        repeats=eval_cfg.repeats,
        backend="hf",
        progress=False,
        ks=[1],
        model_label=model_label,
        success_threshold=success_threshold,
    )
    out: dict[str, float] = {}
    for name, d in res["datasets"].items():
        out[f"{name}/pass@1"] = d["pass@1"]["mean"]
        out[f"{name}/reward_mean"] = d["reward_mean"]["mean"]
        if eval_cfg.repeats > 1:
            out[f"{name}/pass@1_std"] = d["pass@1"]["std"]
    if len(res["datasets"]) > 1:
        out["macro/pass@1"] = res["macro"]["pass@1"]["mean"]
    return out


def best_checkpoint(history: Sequence[dict], key: str, steps: Iterable[int] | None = None) -> int | None:
    """Step of the best checkpoint: the highest ``history[i][key]`` (e.g. ``eval/A/val/pass@1``).

    Rule (paper: checkpoints every 5 steps, the best chosen on a validation set): among rows
    that have a finite value for ``key`` (and whose step is in ``steps`` when given, e.g. the
    steps that have a saved checkpoint), take the highest value; ties go to the **earlier** step
    (fewer updates, cheaper). None when no row qualifies.
    """
    allowed = set(steps) if steps is not None else None
    best: tuple[float, int] | None = None
    for row in history:
        v, step = row.get(key), row.get("step")
        if v is None or step is None or (isinstance(v, float) and math.isnan(v)):
            continue
        if allowed is not None and step not in allowed:
            continue
        if best is None or v > best[0] or (v == best[0] and step < best[1]):
            best = (float(v), int(step))
    return best[1] if best else None


def eval_history(run_dir: Path, checkpoints: list[Path]) -> list[dict]:
    """Rows ``{"step", "eval/...": value}`` of in-training evaluation: the newest checkpoint's
    ``eval_history`` overlaid by ``metrics.jsonl`` (the run's full record)."""

    by_step: dict[int, dict] = {}
    if checkpoints:
        for row in load_checkpoint(checkpoints[-1]).state.get("eval_history", []) or []:
            by_step.setdefault(int(row["step"]), {}).update(row)
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line
            ev = {k: v for k, v in row.items() if k.startswith("eval/")}
            if ev and "step" in row:
                by_step.setdefault(int(row["step"]), {}).update({"step": int(row["step"]), **ev})
    return [by_step[s] for s in sorted(by_step)]


def select_checkpoint(run_dir: Path, step: str | int | None, model: str) -> Path:
    """The checkpoint folder for ``--step`` (None/``latest``, ``best`` or a step number)."""

    if not run_dir.is_dir():
        raise CheckpointError(f"run folder not found: {run_dir}")
    cks = list_checkpoints(run_dir)
    if not cks:
        raise CheckpointError(f"{run_dir}: no complete checkpoint under {run_dir / 'checkpoints'}")
    by_step = {checkpoint_step(p): p for p in cks}
    if step is None or step == "latest":
        return cks[-1]
    if step == "best":
        key = f"eval/{model}/val/pass@1"
        best = best_checkpoint(eval_history(run_dir, cks), key, steps=by_step)
        if best is None:
            raise CheckpointError(
                f"--step best: {run_dir} has no {key} at a saved step (saved steps: "
                f"{sorted(by_step)}; in-training evaluation needs data.val and eval.every > 0)"
            )
        return by_step[best]
    try:
        n = int(step)
    except (TypeError, ValueError):
        raise CheckpointError(f"--step must be a step number, 'latest' or 'best', got {step!r}") from None
    if n not in by_step:
        raise CheckpointError(f"{run_dir}: no checkpoint at step {n}; saved steps: {sorted(by_step)}")
    return by_step[n]


# ----------------------------------------------------------------------------- CLI
