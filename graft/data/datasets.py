"""Prompt loading and the seeded epoch sampler.

Sources (``DataConfig.train`` / ``val``):

* ``path.jsonl`` — one JSON object per line. Blank lines are ignored and not counted.
* ``path.parquet`` — one row per prompt.
* ``path.csv`` / ``path.tsv`` / ``path.json`` (a JSON array or JSON lines), or a folder written by
  ``datasets.Dataset.save_to_disk`` (``path/to/folder``; a ``DatasetDict`` folder takes ``path/to/folder:split``,
  default ``train``) — read with the Hugging Face ``datasets`` library; CSV/TSV cells are read as the text
  written (no type guessing: ids ``007`` and ``7`` stay apart, an answer ``1.50`` stays ``1.50``).
* ``hub:NAME[:split]`` — a Hugging Face dataset (split defaults to ``train``). Hub datasets rarely have an ``id``
  column: ``unique_id`` is used when present, else ``NAME:split:ROW`` (0-based row).
* from Python (``graft.train(cfg, train_dataset=...)``), an in-memory dataset: a list of dicts, a
  ``datasets.Dataset`` or a pandas ``DataFrame`` (rows ``row N``, 1-based, in messages; a saved config names it
  ``<in-memory dataset: N rows>``).
* the name of a procedural task (:mod:`graft.data.tasks`: ``arithmetic``, ``code_task``, ...) — its prompts, made
  from its settings section (``tasks[NAME]``, the config's ``data.NAME``; its defaults when not given).

Columns: graft's names are ``id``, ``problem``, ``answer``, ``tests``, ``entry_point``; ``fields``
(``data.fields``) maps them onto a file's own columns (``{"problem": "question"}``). A row with no ``problem``
column (after ``fields``) but a ``prompt`` column (TRL's name) takes its problem from ``prompt``. The domain's
``reference`` (:class:`graft.domains.Domain`) reads what it grades against from the row (math: the answer; code: the
tests; a user's reward functions: every column, see :func:`reference_row`).

Conversational prompts: a problem that is a list of chat messages (``[{"role": "user", "content": "..."}, ...]``,
TRL's "conversational" format) is a conversation (:attr:`graft.types.Prompt.messages`), rendered as written by the
model's chat template; the prompt's ``problem`` text is its last user message. Every message is a dict with a
``role`` and a text ``content``, and at least one user message has some text.

Ids: a row's ``id`` (integers are converted). A row without one (no ``id`` column, or a null; unless
``data.fields.id`` names a column, which must then be there) gets an id derived from its content:
``row-`` + the first 12 hex digits of the sha256 of the row's canonical JSON (the row as read, every column under its
own name: ``json.dumps(row, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)``, UTF-8), and
``-2``, ``-3``, ... after it for the second, third, ... identical row, in file order. The same file gives the same
ids in every run (so a resumed run finds the same data). Hub datasets keep their own rule (below).

Row rules: ``id`` is a non-empty string; ``problem`` a non-empty string or a conversation; the reference as the domain
requires (by default ``answer``: a non-empty string, or an int/float
converted to text, ``27.0`` -> ``"27"``, ``0.5`` -> ``"0.5"``; ``None``, booleans, lists and dicts are rejected).
Ids must be unique. A bad row raises :class:`DataError` naming the file, the 1-based line (row for
Parquet/CSV/datasets) and the column, or with ``on_bad_row="skip"`` is skipped and counted by reason. No usable
row at all is a :class:`DataError` too, raised before any model is loaded.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from graft.errors import UserError
from graft.registry import BAD_ROWS, TASKS, UnknownName
from graft.types import Messages, Prompt


class DataError(UserError, ValueError):
    """Unusable training or evaluation data; the message names the file and line."""


class RowError(ValueError):
    """A row that cannot be used; ``reason`` is the short key counted under ``on_bad_row="skip"``."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


GRAFT_FIELDS = ("id", "problem", "answer", "tests", "entry_point")
"""The column names graft reads (``data.fields`` maps them onto a file's own)."""

TRL_PROMPT = "prompt"
"""TRL's prompt column: the problem of a row that has no ``problem`` column (after ``data.fields``)."""


# ----------------------------------------------------------------------------- loading


@BAD_ROWS.register("error")
def refuse_bad_row(e: RowError, where: str, skip_hint: str, stats: dict) -> None:
    """``error``: the row stops the load, its location, its fault and ``skip_hint`` in one line."""
    hint = f" ({skip_hint})" if skip_hint else ""
    raise DataError(f"{where}: {e.detail}{hint}") from None


@BAD_ROWS.register("skip")
def skip_bad_row(e: RowError, where: str, skip_hint: str, stats: dict) -> None:
    """``skip``: the row is left out and counted by its reason."""
    stats["skipped"] += 1
    stats["skipped_reasons"][e.reason] = stats["skipped_reasons"].get(e.reason, 0) + 1


def load_prompts(
    spec: str | Any,
    on_bad_row: str = "error",
    tasks: Mapping[str, Any] | None = None,
    limit: int | None = None,
    skip_hint: str = "set data.on_bad_row=skip to skip bad rows",
    fields: Mapping[str, str] | None = None,
    reference: Callable[[Mapping[str, Any]], str] | None = None,
) -> tuple[list[Prompt], dict]:
    """Prompts of ``spec`` and load statistics.

    Returns ``(prompts, stats)`` with ``stats = {"source", "rows", "prompts", "skipped",
    "skipped_reasons": {reason: count}}``; ``rows`` counts the rows read (up to ``limit``
    usable ones: reading stops there). Reasons: ``invalid_json``, ``not_an_object``,
    ``missing_field``, ``bad_id``, ``bad_problem``, ``bad_answer``, ``empty_answer``,
    ``duplicate_id`` (and the reference's own). A bad row under ``on_bad_row="error"`` raises a :class:`DataError`
    naming the file and line, followed by ``skip_hint`` in parentheses (the caller's own switch; empty: no hint).
    ``fields``: graft name -> the file's column (:data:`GRAFT_FIELDS`); ``reference``: ``row -> text`` the grader
    compares against (raises :class:`RowError`; default: :func:`answer_text` of the row's ``answer``); ``tasks``:
    task name -> settings of the procedural tasks (``DataConfig.tasks``; a task not in it runs on its defaults).
    """
    try:
        bad_row = BAD_ROWS[on_bad_row]
    except UnknownName as e:
        raise DataError(f"on_bad_row: {e}") from None
    if limit is not None and limit <= 0:
        raise DataError(f"limit must be positive, got {limit}")
    spec = spec.strip() if isinstance(spec, str) else spec
    stats: dict = {"source": source_name(spec), "rows": 0, "prompts": 0, "skipped": 0, "skipped_reasons": {}}
    where, rows, fields = _source_rows(spec, dict(fields or {}), tasks or {})

    prompts: list[Prompt] = []
    seen: dict[str, str] = {}
    derived = RowIds()
    for loc, row in rows:
        stats["rows"] += 1
        try:
            if isinstance(row, RowError):
                raise row
            p = _to_prompt(row, fields, reference, derived)
            if p.id in seen:
                raise RowError("duplicate_id", f"duplicate id {p.id!r} (first at {seen[p.id]})")
        except RowError as e:
            bad_row(e, f"{where}, {loc}", skip_hint, stats)
            continue
        seen[p.id] = loc
        prompts.append(p)
        if limit is not None and len(prompts) >= limit:
            break
    stats["prompts"] = len(prompts)
    if not prompts:
        raise DataError(
            f"{where}: no usable prompts ({stats['rows']} rows read, {stats['skipped']} skipped: "
            f"{stats['skipped_reasons'] or 'none'})"
        )
    return prompts, stats


def source_name(spec: str | Any) -> str:
    """How messages name a data source: its spec, or ``an in-memory dataset of N rows``."""
    return spec if isinstance(spec, str) else f"an in-memory dataset of {len(spec)} rows"


def _source_rows(
    spec: str | Any, fields: dict[str, str], tasks: Mapping[str, Any]
) -> tuple[str, Iterable[tuple[str, Any]], dict[str, str]]:
    """``(where, rows, fields)`` of a source: its name in messages, its ``(location, row)`` pairs, and the column
    mapping that applies (none for the procedural tasks, whose rows carry graft's names)."""
    bad = [k for k in fields if k not in GRAFT_FIELDS]
    if bad:
        raise DataError(f"data.fields: {bad[0]!r} is not a graft field; map {', '.join(GRAFT_FIELDS)}")
    if not isinstance(spec, str):
        return source_name(spec), _memory_rows(spec), fields
    if spec.startswith("<in-memory dataset"):
        raise DataError(f"{spec} was given from Python (graft.train) and is not saved with the run; pass the data again")
    if spec in TASKS:
        return spec, ((r["id"], r) for r in _task_rows(spec, tasks)), {}
    if spec.startswith("hub:"):
        return (*_hub_rows(spec), fields)
    return (*_file_rows(spec), fields)


def _task_rows(name: str, tasks: Mapping[str, Any]) -> list[dict]:
    """The rows of the procedural task ``name`` under its settings (its defaults when ``tasks`` has none)."""
    task = TASKS[name]
    settings = tasks.get(name) or (task.settings() if task.settings is not None else None)
    try:
        return task.rows(settings)
    except ValueError as e:
        raise DataError(f"data.{name}: {e}") from None


def _memory_rows(data: Any) -> Iterator[tuple[str, Any]]:
    """``(row N, row)`` of a list of dicts, a ``datasets.Dataset`` or a pandas ``DataFrame`` (its cells as Python
    values, through Arrow, as a Parquet file's are)."""
    if type(data).__name__ == "DataFrame":
        import pyarrow as pa  # here, not at the top: gpu_check runs on machines without pyarrow

        data = pa.Table.from_pandas(data, preserve_index=False).to_pylist()
    for i, row in enumerate(data, 1):
        yield f"row {i}", dict(row) if isinstance(row, Mapping) else row


DATASETS_SUFFIXES = {".csv": "csv", ".tsv": "csv", ".json": "json"}
"""File types read through the Hugging Face ``datasets`` library (its builder name)."""


def _file_rows(spec: str) -> tuple[str, Iterable[tuple[str, Any]]]:
    """``(where, rows)`` of a local file or ``datasets`` folder (see the module doc)."""
    path = Path(spec).expanduser()
    folder, _, split = spec.rpartition(":") if ":" in spec and not path.exists() else (spec, "", "")
    if Path(folder).expanduser().is_dir():
        return str(Path(folder).expanduser()), _saved_dataset_rows(Path(folder).expanduser(), split or None)
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".parquet", *DATASETS_SUFFIXES):
        raise DataError(
            f"data source {spec!r}: expected a .jsonl, .parquet, .csv, .tsv or .json file, a folder saved "
            "by datasets, 'hub:NAME[:split]' or 'arithmetic'"
        )
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    if suffix == ".jsonl":
        return str(path), _jsonl_rows(path)
    if suffix == ".parquet":
        return str(path), _parquet_rows(path)
    return str(path), _library_rows(path, suffix)


def _datasets_module(what: str) -> Any:
    try:
        import datasets  # deferred: slow to import, needed only for these sources
    except ImportError:
        raise DataError(f"{what} needs the Hugging Face 'datasets' package: pip install datasets") from None
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def _library_rows(path: Path, suffix: str) -> Iterator[tuple[str, Any]]:
    datasets = _datasets_module(str(path))
    if suffix in (".csv", ".tsv") and not path.read_text(encoding="utf-8", errors="replace").strip("\n\r\t ,").count("\n"):
        return iter(())  # empty or a header alone: no rows ("no usable prompts", as for every other format)
    kwargs = _text_columns(path, datasets, "\t" if suffix == ".tsv" else ",") if suffix in (".csv", ".tsv") else {}
    try:
        ds = datasets.load_dataset(DATASETS_SUFFIXES[suffix], data_files=str(path), split="train", **kwargs)
    except Exception as e:  # noqa: BLE001 - the library raises many types for an unreadable file
        first_line = str(e).splitlines()[0] if str(e) else ""
        raise DataError(f"{path}: not a readable {suffix[1:]} file: {type(e).__name__}: {first_line}") from None
    return ((f"row {i + 1}", rec) for i, rec in enumerate(ds))


def _text_columns(path: Path, datasets: Any, delimiter: str) -> dict:
    """``load_dataset`` arguments that read every CSV cell as the text written (no type guessing: ids "007" and
    "7" stay apart, an answer "1.50" stays "1.50")."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        header = next(csv.reader(f, delimiter=delimiter), [])
    return {"delimiter": delimiter, "features": datasets.Features({c: datasets.Value("string") for c in header})}


def _saved_dataset_rows(folder: Path, split: str | None) -> Iterator[tuple[str, Any]]:
    datasets = _datasets_module(str(folder))
    try:
        ds = datasets.load_from_disk(str(folder))
    except Exception as e:  # noqa: BLE001
        raise DataError(f"{folder}: not a folder saved by datasets (save_to_disk): {type(e).__name__}: {e}") from None
    if isinstance(ds, datasets.DatasetDict):
        split = split or "train"
        if split not in ds:
            raise DataError(f"{folder}: no split {split!r}; it has {', '.join(ds)} (name one as {folder}:SPLIT)")
        ds = ds[split]
    elif split:
        raise DataError(f"{folder}: a single dataset without splits; drop ':{split}'")
    return ((f"row {i + 1}", rec) for i, rec in enumerate(ds))


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield f"line {lineno}", RowError("invalid_json", f"not UTF-8 ({e.reason} at byte {e.start})")
                continue
            if not line.strip():
                continue
            try:
                yield f"line {lineno}", json.loads(line)
            except json.JSONDecodeError as e:
                yield f"line {lineno}", RowError("invalid_json", f"invalid JSON ({e.msg} at column {e.colno})")


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq  # here, not at the top: gpu_check runs on machines without pyarrow

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
    name, _, split = spec[len("hub:") :].partition(":")
    split = split or "train"
    if not name:
        raise DataError(f"data source {spec!r}: expected hub:NAME[:split]")
    datasets = _datasets_module(f"data source {spec!r}")
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


class RowIds:
    """The ids of rows without one, in file order (see the module doc): ``row-`` + 12 hex digits of the sha256 of
    the row's canonical JSON, ``-2``, ``-3``, ... for the second, third, ... identical row."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def __call__(self, row: Mapping[str, Any]) -> str:
        text = json.dumps(row, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
        base = "row-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
        n = self.seen[base] = self.seen.get(base, 0) + 1
        return base if n == 1 else f"{base}-{n}"


def _to_prompt(
    row: Any, fields: Mapping[str, str], reference: Callable[[Mapping[str, Any]], str] | None, derived: RowIds
) -> Prompt:
    """One row as a :class:`Prompt`: its problem (text or conversation), its id (``derived`` from the row when it has
    none) and the reference ``reference`` reads from :func:`reference_row`."""
    if not isinstance(row, dict):
        raise RowError("not_an_object", f"expected a JSON object with problem (or prompt), answer; got {type(row).__name__}")
    named = {g: fields.get(g, g) for g in GRAFT_FIELDS}
    if "problem" not in fields and "problem" not in row and TRL_PROMPT in row:
        named["problem"] = TRL_PROMPT
    missing = [named[k] for k in ("id", "problem") if named[k] not in row and (k == "problem" or k in fields)]
    if missing:
        prompt_too = "problem" not in fields and named["problem"] in missing
        raise RowError("missing_field", f"missing {_columns(missing, fields)}" + (" (or 'prompt')" if prompt_too else ""))
    pid = row.get(named["id"])
    pid = derived(row) if pid is None and "id" not in fields else pid
    if isinstance(pid, bool) or not isinstance(pid, (str, int)) or not str(pid).strip():
        raise RowError("bad_id", f"{_columns([named['id']], fields, 'column')} must be a non-empty string, got {pid!r}")
    problem, messages = _problem(row[named["problem"]], _columns([named["problem"]], fields, "column"))
    mapped = reference_row(row, named, str(pid).strip(), problem if messages is None else list(messages))
    try:
        answer = (
            answer_text(mapped["answer"]) if reference is None and "answer" in mapped else (reference or _needs_answer)(mapped)
        )
    except RowError as e:
        raise _in_columns(e, named, fields) from None
    return Prompt(id=mapped["id"], problem=problem, answer=answer, messages=messages)


def reference_row(row: Mapping[str, Any], named: Mapping[str, str], pid: str, problem: Any) -> dict[str, Any]:
    """The row a reference is read from (and, with ``reward.function``, the columns the functions get): every
    column under its own name, and under graft's name the columns ``named`` maps (``data.fields``: ``question`` is
    also ``problem``), graft's names taking precedence; ``id`` the row's (or derived) id; ``problem`` the problem text
    or the conversation's messages. TRL's ``prompt`` column, when it is the problem, is only ``problem``."""
    kept = {k: v for k, v in row.items() if not (k == TRL_PROMPT and named["problem"] == TRL_PROMPT)}
    return kept | {g: row[c] for g, c in named.items() if c in row} | {"id": pid, "problem": problem}


def _problem(value: Any, column: str) -> tuple[str, Messages | None]:
    """``(problem text, messages)`` of a problem cell: a non-empty text, or a conversation (its last user message
    as the text); else a :class:`RowError` naming ``column``."""
    if isinstance(value, str) and value.strip():
        return value, None
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()  # a numpy array of messages (a pandas or datasets cell)
    if not isinstance(value, (list, tuple)) or not value or not isinstance(value[0], Mapping) or "role" not in value[0]:
        raise RowError("bad_problem", f"{column} must be a non-empty string or a list of chat messages, got {short(value)}")
    messages = []
    for i, m in enumerate(value):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise RowError("bad_problem", f"{column}: message {i} must be a dict with a text role and content, got {short(m)}")
        messages.append({k: v for k, v in m.items() if v is not None})
    user = [m["content"] for m in messages if m["role"] == "user"]
    if not user or not user[-1].strip():
        raise RowError("bad_problem", f"{column}: a conversation needs a user message, its last one with some text")
    return user[-1], tuple(messages)


def _needs_answer(row: Mapping[str, Any]) -> str:
    raise RowError("missing_field", "missing field(s) ['answer']")


def _in_columns(e: RowError, named: dict[str, str], fields: Mapping[str, str]) -> RowError:
    """A reference's error about graft's field names (``answer``, ``tests``) told in the file's columns and
    their ``data.fields`` mapping, when the field is mapped."""
    detail = e.detail
    for g in fields:
        column = f"column {named[g]!r} (data.fields.{g})"
        detail = detail.replace(f"missing field(s) [{g!r}]", f"missing {column}")
        if detail.startswith(f"{g} "):
            detail = f"{column} {detail[len(g) + 1 :]}"
    return RowError(e.reason, detail)


def _columns(names: list[str], fields: Mapping[str, str], word: str = "field") -> str:
    """``field(s) ['id']`` as the row has always said it; with ``data.fields`` the file's column and the mapping
    (``column 'question' (data.fields.problem)``)."""
    if not fields:
        return f"{word}(s) {names}" if word == "field" else names[0]
    inverse = {c: g for g, c in fields.items()}
    return ", ".join(f"column {n!r}" + (f" (data.fields.{inverse[n]})" if n in inverse else "") for n in names)


def answer_text(answer: Any) -> str:
    """A row's ``answer`` as text (see the module doc); raises :class:`RowError`."""
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise RowError("bad_answer", f"answer must be text (or a number), got {type(answer).__name__} {short(answer)}")
    if isinstance(answer, float):
        if not math.isfinite(answer):
            raise RowError("bad_answer", f"answer must be a finite number, got {answer!r}")
        answer = str(int(answer)) if answer.is_integer() else repr(answer)
    text = str(answer).strip()
    if not text:
        raise RowError("empty_answer", "answer is empty")
    return text


def short(x: Any) -> str:
    """``repr(x)`` cut to 60 characters (for messages)."""
    s = repr(x)
    return s if len(s) <= 60 else s[:57] + "..."


def check_batch_fits(prompts: list[Prompt], batch_prompts: int, source: str | Any) -> None:
    """Refuse ``batch_prompts`` larger than the usable prompts of ``source`` (a batch would hold a
    prompt twice); checked right after loading, before any model is loaded."""
    if batch_prompts > len(prompts):
        raise DataError(
            f"batch_prompts: {batch_prompts} exceeds the {len(prompts)} usable prompts of data.train "
            f"({source_name(source)}): a batch would repeat prompts; lower batch_prompts or add data"
        )


def prompts_fingerprint(prompts: list[Prompt]) -> dict:
    """``{"prompts": N, "sha256": hex}`` over every prompt's id, problem and answer (and a conversation's messages as
    canonical JSON), in order.

    Stored in checkpoints (``state["data_fingerprint"]``) so that resuming on a changed data file
    (rows added, removed, reordered or edited) is refused instead of silently continuing.
    """
    h = hashlib.sha256()
    for p in prompts:
        talk = () if p.messages is None else (json.dumps(p.messages, sort_keys=True, ensure_ascii=False, default=str),)
        for part in (p.id, p.problem, p.answer, *talk):
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
        take = self._order[self.pos : self.pos + self.batch_size]
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
        return {
            "epoch": self.epoch,
            "pos": self.pos,
            "order": list(self._order),
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "num_prompts": len(self.prompts),
            "fingerprint": self._fingerprint,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``; rejects a state taken over a different prompt set."""
        n = len(self.prompts)
        if state.get("num_prompts") != n or state.get("fingerprint") != self._fingerprint:
            raise ValueError(
                f"sampler state is for a different prompt set ({state.get('num_prompts')} prompts, "
                f"fingerprint {state.get('fingerprint')}; now {n}, {self._fingerprint})"
            )
        order = [int(i) for i in state["order"]]
        if sorted(order) != list(range(n)) or not 0 <= int(state["pos"]) <= n:
            raise ValueError("sampler state is corrupt (order is not a permutation or pos out of range)")
        if state.get("seed") != self.seed or state.get("shuffle") != self.shuffle:
            raise ValueError(
                f"sampler state was saved with seed={state.get('seed')}, shuffle={state.get('shuffle')}; "
                f"this sampler has seed={self.seed}, shuffle={self.shuffle}"
            )
        self.epoch, self.pos, self._order = int(state["epoch"]), int(state["pos"]), order
