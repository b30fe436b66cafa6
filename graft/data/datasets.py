"""Prompt loading and the seeded epoch sampler.

Sources (``DataConfig.train`` / ``val``):

* ``path.jsonl`` — one JSON object per line with ``id``, ``problem``, ``answer`` (other keys
  ignored). Blank lines are ignored and not counted.
* ``path.parquet`` — the same three columns.
* ``hub:NAME[:split]`` — a Hugging Face dataset (needs the ``datasets`` package; split
  defaults to ``train``). Hub datasets rarely have an ``id`` column: ``unique_id`` is used
  when present, else ``NAME:split:ROW`` (0-based row).
* ``arithmetic`` — the procedural task (:mod:`graft.data.arithmetic`) from an
  :class:`~graft.config.ArithmeticConfig` (its optional ``style`` field picks the phrasing).

Row rules: ``id`` is a non-empty string (integers are converted); ``problem`` a non-empty
string; ``answer`` a non-empty string, or an int/float converted to text (``27.0`` ->
``"27"``, ``0.5`` -> ``"0.5"``); ``None``, booleans, lists and dicts are rejected. Ids must be
unique. A bad row raises :class:`DataError` naming the file and 1-based line (row for
Parquet/hub), or with ``on_bad_row="skip"`` is skipped and counted by reason. No usable
row at all is a :class:`DataError` too, raised before any model is loaded.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import pyarrow.parquet as pq

from graft.config import ArithmeticConfig
from graft.data.arithmetic import make_arithmetic, make_families
from graft.errors import UserError
from graft.types import Prompt


class DataError(UserError, ValueError):
    """Unusable training or evaluation data; the message names the file and line."""


class _BadRow(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


# ----------------------------------------------------------------------------- loading

def load_prompts(spec: str, on_bad_row: str = "error", arithmetic: Any = None, limit: int | None = None,
                 skip_hint: str = "set data.on_bad_row=skip to skip bad rows") -> tuple[list[Prompt], dict]:
    """Prompts of ``spec`` and load statistics.

    Returns ``(prompts, stats)`` with ``stats = {"source", "rows", "prompts", "skipped",
    "skipped_reasons": {reason: count}}``; ``rows`` counts the rows read (up to ``limit``
    usable ones: reading stops there). Reasons: ``invalid_json``, ``not_an_object``,
    ``missing_field``, ``bad_id``, ``bad_problem``, ``bad_answer``, ``empty_answer``,
    ``duplicate_id``. A bad row under ``on_bad_row="error"`` raises a :class:`DataError` naming the file and line,
    followed by ``skip_hint`` in parentheses (the caller's own switch; empty: no hint).
    """
    if on_bad_row not in ("error", "skip"):
        raise DataError(f"on_bad_row must be 'error' or 'skip', got {on_bad_row!r}")
    if limit is not None and limit <= 0:
        raise DataError(f"limit must be positive, got {limit}")
    spec = str(spec).strip()
    stats: dict = {"source": spec, "rows": 0, "prompts": 0, "skipped": 0, "skipped_reasons": {}}
    if spec == "arithmetic":
        prompts = _arithmetic(arithmetic)[:limit]
        stats.update(rows=len(prompts), prompts=len(prompts))
        return prompts, stats
    if spec.startswith("hub:"):
        where, rows = _hub_rows(spec)
    else:
        path = Path(spec).expanduser()
        suffix = path.suffix.lower()
        if suffix not in (".jsonl", ".parquet"):
            raise DataError(f"data source {spec!r}: expected a .jsonl or .parquet file, 'hub:NAME[:split]' or 'arithmetic'")
        if not path.is_file():
            raise DataError(f"data file not found: {path}")
        where = str(path)
        rows = _jsonl_rows(path) if suffix == ".jsonl" else _parquet_rows(path)

    prompts: list[Prompt] = []
    seen: dict[str, str] = {}
    for loc, row in rows:
        stats["rows"] += 1
        try:
            if isinstance(row, _BadRow):
                raise row
            p = _to_prompt(row)
            if p.id in seen:
                raise _BadRow("duplicate_id", f"duplicate id {p.id!r} (first at {seen[p.id]})")
        except _BadRow as e:
            if on_bad_row == "error":
                hint = f" ({skip_hint})" if skip_hint else ""
                raise DataError(f"{where}, {loc}: {e.detail}{hint}") from None
            stats["skipped"] += 1
            stats["skipped_reasons"][e.reason] = stats["skipped_reasons"].get(e.reason, 0) + 1
            continue
        seen[p.id] = loc
        prompts.append(p)
        if limit is not None and len(prompts) >= limit:
            break
    stats["prompts"] = len(prompts)
    if not prompts:
        raise DataError(f"{where}: no usable prompts ({stats['rows']} rows read, {stats['skipped']} skipped: "
                        f"{stats['skipped_reasons'] or 'none'})")
    return prompts, stats


def _arithmetic(cfg: ArithmeticConfig | None) -> list[Prompt]:
    cfg = cfg or ArithmeticConfig()
    try:
        if cfg.families:
            return make_families(cfg.num_prompts, cfg.families, cfg.max_operand, cfg.seed)
        return make_arithmetic(cfg.num_prompts, cfg.max_operand, cfg.ops, cfg.seed, style=cfg.style)
    except ValueError as e:
        raise DataError(f"data.arithmetic: {e}") from None


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield f"line {lineno}", _BadRow("invalid_json", f"not UTF-8 ({e.reason} at byte {e.start})")
                continue
            if not line.strip():
                continue
            try:
                yield f"line {lineno}", json.loads(line)
            except json.JSONDecodeError as e:
                yield f"line {lineno}", _BadRow("invalid_json", f"invalid JSON ({e.msg} at column {e.colno})")


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a corrupt file
        raise DataError(f"{path}: not a readable Parquet file: {e}") from None
    row = 0
    for batch in pf.iter_batches(batch_size=4096):
        for rec in batch.to_pylist():
            row += 1
            yield f"row {row}", rec


def _hub_rows(spec: str) -> tuple[str, Iterable[tuple[str, Any]]]:
    name, _, split = spec[len("hub:"):].partition(":")
    split = split or "train"
    if not name:
        raise DataError(f"data source {spec!r}: expected hub:NAME[:split]")
    try:
        import datasets  # deferred: optional (hub:NAME data only), and slow to import
    except ImportError:
        raise DataError(f"data source {spec!r} needs the Hugging Face 'datasets' package: pip install datasets") from None
    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as e:  # noqa: BLE001 - network, missing dataset or split
        raise DataError(f"cannot load Hugging Face dataset {name!r} split {split!r}: {type(e).__name__}: {e}") from None

    def rows() -> Iterator[tuple[str, Any]]:
        for i, rec in enumerate(ds):
            if isinstance(rec, dict) and "id" not in rec:
                rec = dict(rec, id=rec.get("unique_id", f"{name}:{split}:{i}"))
            yield f"row {i + 1}", rec

    return f"hub:{name}:{split}", rows()


def _to_prompt(row: Any) -> Prompt:
    if not isinstance(row, dict):
        raise _BadRow("not_an_object", f"expected a JSON object with id, problem, answer; got {type(row).__name__}")
    missing = [k for k in ("id", "problem", "answer") if k not in row]
    if missing:
        raise _BadRow("missing_field", f"missing field(s) {missing}")
    pid, problem, answer = row["id"], row["problem"], row["answer"]
    if isinstance(pid, bool) or not isinstance(pid, (str, int)) or not str(pid).strip():
        raise _BadRow("bad_id", f"id must be a non-empty string, got {pid!r}")
    if not isinstance(problem, str) or not problem.strip():
        raise _BadRow("bad_problem", f"problem must be a non-empty string, got {_short(problem)}")
    return Prompt(id=str(pid).strip(), problem=problem, answer=_answer_text(answer))


def _answer_text(answer: Any) -> str:
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise _BadRow("bad_answer", f"answer must be text (or a number), got {type(answer).__name__} {_short(answer)}")
    if isinstance(answer, float):
        if not math.isfinite(answer):
            raise _BadRow("bad_answer", f"answer must be a finite number, got {answer!r}")
        answer = str(int(answer)) if answer.is_integer() else repr(answer)
    text = str(answer).strip()
    if not text:
        raise _BadRow("empty_answer", "answer is empty")
    return text


def _short(x: Any) -> str:
    s = repr(x)
    return s if len(s) <= 60 else s[:57] + "..."


def check_batch_fits(prompts: list[Prompt], batch_prompts: int, source: str) -> None:
    """Refuse ``batch_prompts`` larger than the usable prompts of ``source`` (a batch would hold a
    prompt twice); checked right after loading, before any model is loaded."""
    if batch_prompts > len(prompts):
        raise DataError(f"batch_prompts: {batch_prompts} exceeds the {len(prompts)} usable prompts of data.train "
                        f"({source}): a batch would repeat prompts; lower batch_prompts or add data")


def prompts_fingerprint(prompts: list[Prompt]) -> dict:
    """``{"prompts": N, "sha256": hex}`` over every prompt's id, problem and answer, in order.

    Stored in checkpoints (``state["data_fingerprint"]``) so that resuming on a changed data file
    (rows added, removed, reordered or edited) is refused instead of silently continuing.
    """
    h = hashlib.sha256()
    for p in prompts:
        for part in (p.id, p.problem, p.answer):
            b = part.encode("utf-8")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    return {"prompts": len(prompts), "sha256": h.hexdigest()}


# ----------------------------------------------------------------------------- sampling

class PromptSampler:
    """Batches of prompts, epoch after epoch, each epoch a seeded permutation of all prompts.

    * Epoch ``e`` is ordered by ``numpy.random.default_rng([seed, e]).permutation(N)``
      (identity when ``shuffle=False``), so the order does not depend on what was drawn
      before, only on (seed, epoch).
    * Every epoch covers every prompt exactly once. A batch that reaches the end of an
      epoch takes the epoch's remaining prompts and fills up from the next epoch. So that a
      batch never holds the same prompt twice (groups are keyed by prompt id), the next
      epoch's first prompts that are already in the batch are moved, in order, to just after
      the ones taken: epoch ``e + 1`` is then still a permutation, only its head differs.
    * ``next_batch()`` returns the batch and the epoch its **first** prompt belongs to.
    * ``state_dict()``/``load_state_dict()`` capture the epoch, the position and the current
      epoch's order, so a resumed sampler continues with exactly the same batches,
      including when the checkpoint fell on an epoch boundary. The batch size may differ
      on resume (the prompt sequence continues); seed, shuffle and the prompt set may not.

    Requires ``batch_size <= len(prompts)`` and unique prompt ids.
    """

    def __init__(self, prompts: list[Prompt], batch_size: int, seed: int, shuffle: bool = True):
        if not prompts:
            raise ValueError("PromptSampler needs at least one prompt")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if batch_size > len(prompts):
            raise ValueError(f"batch_size {batch_size} exceeds the {len(prompts)} prompts: a batch would repeat prompts")
        ids = [p.id for p in prompts]
        if len(set(ids)) != len(ids):
            raise ValueError("prompt ids must be unique")
        self.prompts = list(prompts)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self._fingerprint = hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]
        self.epoch = 0
        self.pos = 0
        self._order = self._permutation(0)

    def __len__(self) -> int:
        return len(self.prompts)

    def _permutation(self, epoch: int) -> list[int]:
        n = len(self.prompts)
        if not self.shuffle:
            return list(range(n))
        return np.random.default_rng([self.seed, epoch]).permutation(n).tolist()

    def next_batch(self) -> tuple[list[Prompt], int]:
        """The next ``batch_size`` prompts and the epoch of the first of them."""
        n = len(self.prompts)
        if self.pos >= n:
            self._advance_epoch(taken=set(), need=0)
        epoch = self.epoch
        take = self._order[self.pos:self.pos + self.batch_size]
        self.pos += len(take)
        need = self.batch_size - len(take)
        if need:
            self._advance_epoch(taken=set(take), need=need)
            take += self._order[:need]
            self.pos = need
        return [self.prompts[i] for i in take], epoch

    def _advance_epoch(self, taken: set[int], need: int) -> None:
        self.epoch += 1
        self.pos = 0
        order = self._permutation(self.epoch)
        if taken:
            head = [i for i in order if i not in taken][:need]
            head_set = set(head)
            order = head + [i for i in order if i not in head_set]
        self._order = order

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "order": list(self._order), "seed": self.seed,
                "shuffle": self.shuffle, "batch_size": self.batch_size, "num_prompts": len(self.prompts),
                "fingerprint": self._fingerprint}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``; rejects a state taken over a different prompt set."""
        n = len(self.prompts)
        if state.get("num_prompts") != n or state.get("fingerprint") != self._fingerprint:
            raise ValueError(f"sampler state is for a different prompt set ({state.get('num_prompts')} prompts, "
                             f"fingerprint {state.get('fingerprint')}; now {n}, {self._fingerprint})")
        order = [int(i) for i in state["order"]]
        if sorted(order) != list(range(n)) or not 0 <= int(state["pos"]) <= n:
            raise ValueError("sampler state is corrupt (order is not a permutation or pos out of range)")
        if state.get("seed") != self.seed or state.get("shuffle") != self.shuffle:
            raise ValueError(f"sampler state was saved with seed={state.get('seed')}, shuffle={state.get('shuffle')}; "
                             f"this sampler has seed={self.seed}, shuffle={self.shuffle}")
        self.epoch, self.pos, self._order = int(state["epoch"]), int(state["pos"]), order
