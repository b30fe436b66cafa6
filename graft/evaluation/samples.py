"""``graft samples RUN``: read what a model wrote -- a reproducible random pick of a run's responses.

This project's first lesson (README Results): twice a reward rose because a policy found a shortcut
the grader scored, and both times the figures looked like learning. The reward monitor
(:mod:`graft.reward.shortcuts`) counts the known shortcuts; reading answers finds the next one. This
command prints ``n`` responses drawn uniformly at random (seeded, so two readers see the same ones)
from one of three sources:

- ``train``: the run's own rollouts (its trajectory store), written by ``--model``;
- ``peer``: rollouts another model *admitted* into ``--model``'s update (the exchange's treatment);
- ``eval``: held-out responses of a final evaluation (``RUN/eval_final/MODEL``, ``RUN/eval/MODEL`` of
  a recorded run, or a ``graft eval`` output folder given as RUN).

A response is rewarded when its reward is above the run's ``reward.success_threshold`` (:func:`run_threshold`: its
``config.yaml``, or a ``graft eval`` folder's ``protocol.json``). ``--reward both`` (the default) draws up to half of
the ``n`` from the rewarded responses and the rest from the unrewarded ones (:func:`pick_mixed`: a run whose models
rarely succeed still shows what a success looks like, and what a failure is); ``1`` keeps rewarded responses only,
``0`` unrewarded ones, ``any`` draws from all alike. Each sample is printed with its step, writer, prompt id,
reference answer, reward and the monitor's flags. Eval files hold no question text: ``--data FILE`` (the eval JSONL,
repeatable) joins it by id.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

from graft.config import run_success_threshold, success_threshold_of
from graft.data.datasets import load_prompts
from graft.domains import Domain
from graft.errors import UserError
from graft.evaluation.evaluate import PromptRecord
from graft.storage.trajectory_store import TrajectoryStore
from graft.success import succeeded

Source = Literal["train", "peer", "eval"]


class SamplesError(UserError):
    """Nothing to read where asked, or a bad switch; the message says what was looked for and where."""


@dataclass(frozen=True)
class Sample:
    """One response as a reader sees it."""

    source: str
    """``train``, ``peer`` or ``eval``."""
    writer: str
    """The model that generated the response."""
    receiver: str | None
    """``peer``: the model that admitted it into its update; otherwise None."""
    step: int | None
    """Training step (None for eval)."""
    dataset: str | None
    """Eval set name (None for training rows)."""
    prompt_id: str
    problem: str | None
    answer: str
    response: str
    reward: float
    status: str | None = None
    """The verifier's status when the run recorded it (sets the domain's status flags, e.g. ``holdout_fail``)."""

    def flags(self, domain: Domain) -> list[str]:
        """The domain's reward-monitor flags set on this response (empty without the question's text)."""
        if self.problem is None:
            return []
        return [k for k, v in domain.response_flags(self.response, self.problem, self.answer, self.status).items() if v]


def run_threshold(run: Path) -> float:
    """The ``reward.success_threshold`` the responses under ``run`` were counted with: a run folder's ``config.yaml``,
    else a ``graft eval`` output folder's ``protocol.json``; the default when neither says."""
    protocol = run / "protocol.json"
    if not (run / "config.yaml").is_file() and protocol.is_file():
        try:
            value = json.loads(protocol.read_text()).get("success_threshold")
        except (OSError, ValueError, AttributeError):
            value = None
        return success_threshold_of({"reward": {"success_threshold": value}})
    return run_success_threshold(run)


def rewarded(reward: float, threshold: float) -> bool:
    """A rewarded response: its reward is above ``threshold``, as the run counts a success
    (:func:`graft.success.succeeded`)."""
    return succeeded(reward, threshold)


def keep_reward(reward: float, wanted: str, threshold: float) -> bool:
    """``wanted`` ``1``: rewarded (:func:`rewarded`); ``0``: not; ``any`` and ``both``: either."""
    return wanted in ("any", "both") or rewarded(reward, threshold) == (wanted == "1")


def pick(samples: Sequence[Sample], n: int, seed: int) -> list[Sample]:
    """``n`` of ``samples`` uniformly at random without replacement (all when fewer), in their given order."""
    assert n >= 0, n
    chosen = sorted(random.Random(seed).sample(range(len(samples)), min(n, len(samples))))
    return [samples[i] for i in chosen]


def pick_mixed(samples: Sequence[Sample], n: int, seed: int, threshold: float) -> list[Sample]:
    """``n`` of ``samples``, half of them (rounded up) rewarded and the rest not, each half drawn uniformly at random
    without replacement; when one kind has too few, the other fills the ``n`` (all when fewer), in their given order.
    E.g. n = 12 of 3 rewarded and 100 unrewarded: the 3 and 9 of the 100."""
    assert n >= 0, n
    good = [i for i, s in enumerate(samples) if rewarded(s.reward, threshold)]
    bad = [i for i, s in enumerate(samples) if not rewarded(s.reward, threshold)]
    k_good = min(len(good), max((n + 1) // 2, n - len(bad)))
    k_bad = min(len(bad), n - k_good)
    rng = random.Random(seed)
    chosen = rng.sample(good, k_good) + rng.sample(bad, k_bad)
    return [samples[i] for i in sorted(chosen)]


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """``"13-18"`` -> (13, 18); ``"7"`` -> (7, 7); None -> None (every step)."""
    if text is None:
        return None
    lo, _, hi = text.partition("-")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise SamplesError(f"--steps {text!r}: expected a step or a range, e.g. 7 or 13-18") from None
    if a < 1 or b < a:
        raise SamplesError(f"--steps {text!r}: expected 1 <= first <= last")
    return a, b


def store_samples(
    run: Path, source: Source, model: str | None, steps: tuple[int, int] | None, reward: str, threshold: float
) -> list[Sample]:
    """Training rows of the run's trajectory store: ``train`` -- written by ``model`` (None: any);
    ``peer`` -- admitted by ``model`` (None: by any model), one sample per (response, receiver)."""
    store = TrajectoryStore(run)
    if not (stored := store.steps()):
        raise SamplesError(
            f"no trajectory store under {run} (step_NNNNNN.parquet files in {run}/trajectories): "
            "a recorded run keeps its small files only; read it with --from eval"
        )
    wanted = None if steps is None else [s for s in stored if steps[0] <= s <= steps[1]]
    if wanted == [] and steps is not None:
        raise SamplesError(f"no stored step of {run} lies in --steps {steps[0]}-{steps[1]} (stored: {stored[0]}-{stored[-1]})")
    cols = ["model", "step", "prompt_id", "problem", "answer", "response", "reward", "admitted_by", "verify_status"]
    t = store.read(models=[model] if source == "train" and model else None, steps=wanted, columns=cols)
    c = {k: t[k].to_pylist() for k in cols}
    out = []
    for r in range(t.num_rows):
        if not keep_reward(c["reward"][r], reward, threshold):
            continue
        receivers = [None] if source == "train" else [x for x in c["admitted_by"][r] if model in (None, x)]
        for receiver in receivers:
            out.append(
                Sample(
                    source,
                    c["model"][r],
                    receiver,
                    c["step"][r],
                    None,
                    c["prompt_id"][r],
                    c["problem"][r],
                    c["answer"][r],
                    c["response"][r],
                    float(c["reward"][r]),
                    c["verify_status"][r],
                )
            )
    return out


def eval_folders(run: Path, model: str | None) -> dict[str, Path]:
    """Model -> its eval output folder (holding ``results.json``): RUN itself (a ``graft eval`` output,
    named ``model`` or ``eval``), else ``RUN/eval_final/M`` and ``RUN/eval/M``."""
    if (run / "results.json").is_file():
        return {model or run.name: run}
    found: dict[str, Path] = {}
    for parent in (run / "eval_final", run / "eval"):
        for d in sorted(parent.glob("*/results.json")) if parent.is_dir() else []:
            if model in (None, d.parent.name):
                found.setdefault(d.parent.name, d.parent)
    return found


def eval_samples(run: Path, model: str | None, reward: str, problems: dict[str, str], threshold: float) -> list[Sample]:
    """Every eval response of ``model`` (None: every model) under RUN (:func:`eval_folders`); the question
    text from ``problems`` (id -> problem) where given."""
    folders = eval_folders(run, model)
    if not folders:
        who = f"model {model!r}" if model else "any model"
        raise SamplesError(
            f"no evaluation of {who} under {run} (looked for {run}/results.json, "
            f"{run}/eval_final/MODEL/results.json and {run}/eval/MODEL/results.json)"
        )
    out: list[Sample] = []
    for name, folder in folders.items():
        for path in sorted(folder.glob("*/repeat_*.jsonl")):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    rec = PromptRecord.from_dict(json.loads(line))
                except (ValueError, KeyError, TypeError) as e:
                    raise SamplesError(
                        f"{path}:{i}: not an eval response row (id, answer, responses, rewards): {type(e).__name__}: {e}"
                    ) from None
                out.extend(
                    Sample("eval", name, None, None, path.parent.name, rec.id, problems.get(rec.id), rec.answer, response, x, s)
                    for response, x, s in zip(rec.responses, rec.rewards, rec.statuses, strict=True)
                    if keep_reward(x, reward, threshold)
                )
    return out


ANSWER_WIDTH = 60
"""The header shows the reference answer whitespace-collapsed and cut at this many characters (a code task's
reference is its tests' JSON)."""


def _one_line(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _lines(text: str, width: int) -> str:
    kept = text.strip("\n")
    kept = kept if len(kept) <= width else kept[: width - 1] + "…"
    return "\n   ".join(line.rstrip() for line in kept.splitlines())


def format_sample(s: Sample, domain: Domain, width: int = 400) -> str:
    """A header (where the response comes from, its reference answer cut at :data:`ANSWER_WIDTH`, reward and flags),
    the question and the response, each whitespace-collapsed to one line and cut at ``width`` characters; a
    response of a domain whose layout is meaning (``Domain.keeps_lines``: code) keeps its lines, each indented
    under ``A:``."""
    where = f"step {s.step}" if s.step is not None else s.dataset
    who = f"{s.writer} -> {s.receiver}" if s.receiver else s.writer
    head = f"-- {where} · {who} · {s.prompt_id} · answer {_one_line(str(s.answer), ANSWER_WIDTH)} · reward {s.reward:g}"
    if flags := s.flags(domain):
        head += " · flags: " + ", ".join(flags)
    question = _one_line(s.problem, width) if s.problem is not None else "(question text not stored; --data FILE)"
    response = _lines(s.response, width) if domain.keeps_lines else _one_line(s.response, width)
    return f"{head}\nQ: {question}\nA: {response}"


def _problems(files: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in files:
        prompts, _ = load_prompts(f, on_bad_row="skip", reference=lambda row: "")  # the problems only: no answer needed
        out.update({p.id: p.problem for p in prompts})
    return out


def collect(
    run: Path,
    source: Source,
    model: str | None,
    steps: tuple[int, int] | None,
    reward: str,
    threshold: float,
    data: Sequence[str] = (),
) -> list[Sample]:
    """Every matching response of the run, in file order (:func:`pick` draws from them); ``reward`` picks by success
    at ``threshold`` (:func:`run_threshold`)."""
    if not run.exists():
        raise SamplesError(f"{run}: no such run folder")
    if source == "eval":
        if steps is not None:
            raise SamplesError("--steps applies to training rows (--from train or peer), not to --from eval")
        return eval_samples(run, model, reward, _problems(data), threshold)
    return store_samples(run, source, model, steps, reward, threshold)
