"""The Parquet trajectory store: every rollout of every model, one file per step.

Layout: ``ROOT/step_000003.parquet`` (ROOT is ``RUN_DIR/trajectories`` in a run). One row per
response of a group that a model generated itself (``source == holder``); peer groups are not
duplicated, their use is recorded in the ``used_as_peer_by`` / ``admitted_by`` / ``weight_by``
columns of the source's rows. A store holds one run (``run_id``); several models share each
step file.

Schema (``SCHEMA_VERSION`` = 1, stored in every file's key-value metadata as
``graft.schema_version``, next to ``graft.run_id`` and ``graft.step``):

==================  ==============  ====================================================================
column              type            meaning
==================  ==============  ====================================================================
run_id              string          id of the run that wrote the row
model               string          model label (``A``, ``B``, ...) that generated the response
tokenizer           string          tokenizer name/path of that model (interprets ``response_token_ids``)
step                int64           training step that produced the group
epoch               int64           data epoch of that step
prompt_id           string          prompt id
problem             string          problem text (without template)
answer              string          reference answer
prompt_text         string          the prompt exactly as the model saw it (template applied)
response            string          response text (special tokens stripped)
response_token_ids  list<int32>     tokens as the model sampled them (``RolloutGroup.gen_token_ids``)
gen_logprobs        list<float32>   sampler log-prob of each of those tokens (pi_phi in spec §3.4)
finished            bool            ended with EOS (False: cut at max_new_tokens)
reward              float64         verified reward (0/1)
verify_status       string          ok / timeout / no_answer / error
advantage           float64         GRPO advantage the model trained with (frozen source advantage)
group_index         int32           position of the response in its group, 0..group_size-1
group_size          int32           G, responses in the group
used_as_peer_by     list<string>    receivers this response was handed to (transferred)
admitted_by         list<string>    subset of ``used_as_peer_by`` whose gate admitted it
weight_by           list<float64>   ALIGNED WITH ``used_as_peer_by``: the sequence weight receiver
                                    ``used_as_peer_by[i]`` gave it (min(s, cap); 0.0 when dropped)
messages            string          a conversational prompt's chat messages as JSON (``problem`` is its last
                                    user message); null for a text prompt. Optional (:data:`OPTIONAL`)
==================  ==============  ====================================================================

Atomicity: a step file is written to ``.step_000003.parquet.<pid>.tmp``, fsynced and
``os.replace``-d onto its final name, then the folder is fsynced. Readers only look at
``step_*.parquet``, so a step's rows appear all at once or not at all, and rewriting a step
(a resumed run re-running it) replaces the file instead of adding rows. On resume, call
:meth:`TrajectoryStore.truncate_after` with the checkpoint's step; write a step's file
*before* saving that step's checkpoint, so every step up to the checkpoint is in the store.

Reading checks each file: unreadable/truncated Parquet, a different schema version, or a
missing column raise :class:`StoreError` naming the file (extra columns are ignored; an :data:`OPTIONAL` column
that a file written before it lacks reads as nulls). A resume checks the
files up to its checkpoint's step from their footers (:meth:`TrajectoryStore.first_torn`): a resume re-runs
only later steps, so a torn earlier file would otherwise stay and fail every later read.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from graft.errors import UserError
from graft.files import dumps_json, fsync_path, writing
from graft.registry import PICKS
from graft.storage.lock import FolderLock
from graft.success import succeeded
from graft.types import GroupCounts, Messages, RolloutGroup

SCHEMA_VERSION = 1
"""Bump when a column is removed, renamed or changes meaning; readers refuse other versions."""

SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("model", pa.string()),
        ("tokenizer", pa.string()),
        ("step", pa.int64()),
        ("epoch", pa.int64()),
        ("prompt_id", pa.string()),
        ("problem", pa.string()),
        ("answer", pa.string()),
        ("prompt_text", pa.string()),
        ("response", pa.string()),
        ("response_token_ids", pa.list_(pa.int32())),
        ("gen_logprobs", pa.list_(pa.float32())),
        ("finished", pa.bool_()),
        ("reward", pa.float64()),
        ("verify_status", pa.string()),
        ("advantage", pa.float64()),
        ("group_index", pa.int32()),
        ("group_size", pa.int32()),
        ("used_as_peer_by", pa.list_(pa.string())),
        ("admitted_by", pa.list_(pa.string())),
        ("weight_by", pa.list_(pa.float64())),
        ("messages", pa.string()),
    ]
)

OPTIONAL = ("messages",)
"""Columns added to schema version 1 after its first files: a file without one reads it as nulls."""

_META_VERSION = b"graft.schema_version"
_FILE_RE = re.compile(r"^step_(\d+)\.parquet$")

PeerUse = dict[tuple[str, str, int], list[tuple[str, bool, float]]]
"""(source model, prompt_id, group_index in the source's full group) -> [(receiver, admitted, weight)]."""


class StoreError(UserError, RuntimeError):
    """A trajectory store that cannot be read or written; the message names the file."""


@dataclass
class StoredGroup(GroupCounts):
    """One stored group: the G responses ``model`` generated for ``prompt_id`` at ``step``."""

    model: str
    tokenizer: str
    run_id: str
    step: int
    epoch: int
    prompt_id: str
    problem: str
    answer: str
    prompt_text: str
    messages: Messages | None = None
    """A conversational prompt's messages (None: a text prompt)."""
    responses: list[str] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    """[G][T'] the generating model's tokens."""
    gen_logprobs: list[list[float]] = field(default_factory=list)
    """[G][T'] the sampler's log-probs of ``token_ids`` (float32 precision)."""
    finished: list[bool] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)


Eligible = Callable[["StoredGroup"], bool]
"""Whether a stored group may play the peer (the candidate rule)."""
Successes = Callable[["StoredGroup"], int]
"""k of a stored group: its rewards above the run's ``reward.success_threshold``."""


def select_stored_group(
    groups_for_prompt: list[StoredGroup],
    receiver_step: int,
    pick: str = "latest",
    eligible: Callable[[StoredGroup], bool] | None = None,
    threshold: float | None = None,
) -> StoredGroup | None:
    """Which stored group of one prompt plays the peer at ``receiver_step`` (pure): the pick rule ``PICKS[pick]``
    over the groups ``eligible`` accepts (all without it), successes counted above ``threshold``
    (``reward.success_threshold``; ``any`` ranks by them and needs it); ``None`` when nothing qualifies. Ties at equal
    step go to the later entry of the list."""
    pool = [g for g in groups_for_prompt if eligible is None or eligible(g)]
    return PICKS[pick](pool, receiver_step, lambda g: True, _successes(threshold))


def _successes(threshold: float | None) -> Callable[[StoredGroup], int]:
    def k(g: StoredGroup) -> int:
        if threshold is None:
            raise ValueError("pick 'any' ranks groups by successes: give the threshold (reward.success_threshold)")
        return g.successes(threshold)

    return k


def _last(pool: list[StoredGroup], key: Callable[[StoredGroup], tuple[int, ...]]) -> StoredGroup | None:
    """The group of ``pool`` with the largest ``key``, the later entry on a tie."""
    return max(enumerate(pool), key=lambda ig: (*key(ig[1]), ig[0]))[1] if pool else None


@PICKS.register("latest")
def pick_latest(groups: list[StoredGroup], step: int, eligible: Eligible, successes: Successes) -> StoredGroup | None:
    """The group with the highest step not after ``step``, whatever its success count (the candidate rule decides:
    an all-fail latest group means the peer fails too, never an older success); ``eligible`` is not applied."""
    return _last([g for g in groups if g.step <= step], lambda g: (g.step,))


@PICKS.register("same_step")
def pick_same_step(groups: list[StoredGroup], step: int, eligible: Eligible, successes: Successes) -> StoredGroup | None:
    """The group written at ``step`` itself, whatever its success count; ``eligible`` is not applied."""
    return _last([g for g in groups if g.step == step], lambda g: ())


@PICKS.register("any")
def pick_any(groups: list[StoredGroup], step: int, eligible: Eligible, successes: Successes) -> StoredGroup | None:
    """The ``eligible`` group with most successes (ties: the highest step), at any step; with none eligible, the
    latest group (:func:`pick_latest`)."""
    best = _last([g for g in groups if eligible(g)], lambda g: (successes(g), g.step))
    return best if best is not None else pick_latest(groups, step, eligible, successes)


# ----------------------------------------------------------------------------- file helpers


def _resolve_root(path: str | Path) -> Path:
    """A store folder, or a run folder holding ``trajectories/``."""
    p = Path(path)
    if p.is_dir() and not any(_FILE_RE.match(x.name) for x in p.iterdir()) and (p / "trajectories").is_dir():
        return p / "trajectories"
    return p


_EXPECTED = (
    "graft store expects a trajectory store folder (RUN/trajectories, holding step_NNNNNN.parquet files), "
    "a run folder holding trajectories/, or one step_NNNNNN.parquet file"
)


def _not_a_store(path: Path) -> str:
    if not path.exists():
        return f"no trajectory store at {path}: no such file or folder; {_EXPECTED}"
    if path.is_file():
        return f"{path} is a file but not a trajectory store step file (step_NNNNNN.parquet); {_EXPECTED}"
    return f"no trajectory store at {path}: it holds no step_NNNNNN.parquet files; {_EXPECTED}"


def _check_footer(path: Path) -> list[str]:
    """Validate one step file from its footer alone (cheap): a readable Parquet footer, graft's schema version,
    every column (:data:`OPTIONAL` ones aside); else a :class:`StoreError` naming the file. Returns its columns."""
    try:
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
    except (pa.ArrowException, OSError) as e:
        raise StoreError(f"{path}: not a readable Parquet file (truncated or corrupt): {e}") from None
    meta = schema.metadata or {}
    found = meta.get(_META_VERSION)
    if found is None:
        raise StoreError(f"{path}: no graft schema version in the file metadata; not a graft trajectory store file")
    try:
        found_v = int(found)
    except ValueError:
        raise StoreError(f"{path}: bad schema version {found!r}") from None
    if found_v != SCHEMA_VERSION:
        raise StoreError(
            f"{path}: trajectory store schema version {found_v}, this graft reads version {SCHEMA_VERSION}; "
            "use the graft release that wrote the store (or re-export it)"
        )
    missing = [c for c in SCHEMA.names if c not in schema.names and c not in OPTIONAL]
    if missing:
        raise StoreError(f"{path}: missing column(s) {missing}")
    return list(schema.names)


def _read_file(path: Path, columns: list[str] | None = None, filters=None) -> pa.Table:
    """Read and validate one step file; returns a table with ``columns`` (default: all) cast to SCHEMA."""
    present = _check_footer(path)
    wanted = columns or SCHEMA.names
    try:
        table = pq.read_table(path, columns=[c for c in wanted if c in present], filters=filters)
        for c in wanted:
            if c not in present:  # an OPTIONAL column the file predates
                table = table.append_column(SCHEMA.field(c), pa.nulls(table.num_rows, SCHEMA.field(c).type))
        target = pa.schema([SCHEMA.field(c) for c in wanted])
        return table.select(list(wanted)).cast(target)
    except (pa.ArrowException, OSError) as e:
        raise StoreError(f"{path}: cannot read rows (truncated or corrupt file?): {e}") from None


def _messages_json(messages: Messages | None) -> str | None:
    return None if messages is None else json.dumps(list(messages), ensure_ascii=False, default=str)


# ----------------------------------------------------------------------------- the store


class TrajectoryStore:
    """Reader and writer of one run's trajectory store at ``root``.

    Constructing does not touch the disk; the folder is created by the first :meth:`write_step`.
    ``run_id`` is needed only for writing. Given a run folder holding ``trajectories/``,
    reads use that subfolder; given one ``step_NNNNNN.parquet`` file, reads see only that step.
    """

    def __init__(self, root: str | Path, run_id: str | None = None) -> None:
        self.given = Path(root)
        self.root = _resolve_root(root)
        self.run_id = run_id
        self._only_step: int | None = None
        self._lock: FolderLock | None = None
        m = _FILE_RE.match(self.root.name)
        if m and self.root.is_file():  # a single step file: read-only view of that step
            self.root, self._only_step = self.root.parent, int(m.group(1))

    # ------------------------------------------------------------------ paths

    def path_for(self, step: int) -> Path:
        return self.root / f"step_{step:06d}.parquet"

    def steps(self) -> list[int]:
        """Steps with a visible (committed) file, ascending."""
        if not self.root.is_dir():
            return []
        return sorted(
            int(m.group(1))
            for p in self.root.iterdir()
            if (m := _FILE_RE.match(p.name)) and self._only_step in (None, int(m.group(1)))
        )

    def _cleanup_tmp(self) -> None:
        for p in self.root.glob(".step_*.parquet.*.tmp"):
            try:
                pid = int(p.name.split(".")[-2])
            except ValueError:
                pid = -1
            alive = False
            if pid > 0 and pid != os.getpid():
                try:
                    os.kill(pid, 0)
                    alive = True
                except ProcessLookupError:
                    alive = False
                except PermissionError:
                    alive = True
            if not alive:
                p.unlink(missing_ok=True)

    # ------------------------------------------------------------------ write

    def _rows(
        self, step: int, epoch: int, groups: list[RolloutGroup], tokenizer_names: dict[str, str], peer_use: PeerUse | None
    ) -> dict[str, list]:
        cols: dict[str, list] = {n: [] for n in SCHEMA.names}
        peer_use = peer_use or {}
        for g in groups:
            if g.source != g.holder:
                continue
            n = g.size
            for name in ("rewards", "status", "advantages"):
                if len(getattr(g, name)) != n:
                    raise StoreError(
                        f"step {step}: group {g.source}/{g.prompt_id} has {len(getattr(g, name))} {name}, "
                        f"expected {n} (score the group before storing it)"
                    )
            if g.source not in tokenizer_names:
                raise StoreError(f"step {step}: no tokenizer name given for model {g.source!r}")
            for i in range(n):
                uses = peer_use.get((g.source, g.prompt_id, i), [])
                cols["run_id"].append(self.run_id)
                cols["model"].append(g.source)
                cols["tokenizer"].append(tokenizer_names[g.source])
                cols["step"].append(int(step))
                cols["epoch"].append(int(epoch))
                cols["prompt_id"].append(g.prompt_id)
                cols["problem"].append(g.problem)
                cols["answer"].append(g.answer)
                cols["prompt_text"].append(g.prompt_text)
                cols["response"].append(g.responses[i])
                cols["response_token_ids"].append(list(g.gen_token_ids[i]))
                cols["gen_logprobs"].append(list(g.gen_logprobs[i]))
                cols["finished"].append(bool(g.finished[i]))
                cols["reward"].append(float(g.rewards[i]))
                cols["verify_status"].append(g.status[i])
                cols["advantage"].append(float(g.advantages[i]))
                cols["group_index"].append(i)
                cols["group_size"].append(n)
                cols["used_as_peer_by"].append([u[0] for u in uses])
                cols["admitted_by"].append([u[0] for u in uses if u[1]])
                cols["weight_by"].append([float(u[2]) for u in uses])
                cols["messages"].append(_messages_json(g.messages))
        return cols

    def write_step(
        self, step: int, epoch: int, groups: list[RolloutGroup], tokenizer_names: dict[str, str], peer_use: PeerUse | None = None
    ) -> Path:
        """Write (or atomically replace) the file of ``step``: one row per response of every own
        group in ``groups`` (``source == holder``; peer copies are skipped). ``peer_use`` keys use
        the response's index in the source's full group. A step with no groups still gets an
        (empty) file, marking the step as done. Returns the file path."""
        if not self.run_id:
            raise StoreError("TrajectoryStore needs a run_id to write")
        if self._only_step is not None:
            raise StoreError(f"{self.given}: a single step file is read-only; open its folder to write")
        self.root.mkdir(parents=True, exist_ok=True)
        self._hold_writer_lock()
        self._cleanup_tmp()
        table = pa.Table.from_pydict(self._rows(step, epoch, groups, tokenizer_names, peer_use), schema=SCHEMA)
        table = table.replace_schema_metadata(
            {
                _META_VERSION: str(SCHEMA_VERSION).encode(),
                b"graft.run_id": str(self.run_id).encode(),
                b"graft.step": str(int(step)).encode(),
            }
        )
        final = self.path_for(step)
        tmp = self.root / f".{final.name}.{os.getpid()}.tmp"
        try:
            with writing(final), open(tmp, "wb") as f:
                pq.write_table(table, f, compression="zstd")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_path(self.root)
        return final

    def truncate_after(self, step: int) -> list[int]:
        """Delete the files of steps > ``step`` (they are re-run after resuming). Returns those steps."""
        if self.root.is_dir():
            self._hold_writer_lock()
        gone = [s for s in self.steps() if s > step]
        for s in gone:
            self.path_for(s).unlink(missing_ok=True)
        if gone:
            fsync_path(self.root)
        return gone

    def first_torn(self, upto: int) -> tuple[int, str] | None:
        """The lowest step <= ``upto`` whose file fails :func:`_check_footer` (truncated, corrupt footer, another
        schema), with the reason naming the file; ``None`` when every such file passes. Reads footers only."""
        for s in self.steps():
            if s > upto:
                break
            try:
                _check_footer(self.path_for(s))
            except StoreError as e:
                return s, str(e)
        return None

    def _hold_writer_lock(self) -> None:
        """One writer per store: taken by the first write, held until :meth:`close` (or the process ends);
        a second writer stops with a :class:`~graft.storage.lock.LockError` naming the holder."""
        if self._lock is None:
            self._lock = FolderLock(self.root, "trajectory store").acquire()

    def close(self) -> None:
        """Release the writer lock (reading needs none)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # ------------------------------------------------------------------ read

    def _files(self, steps: Iterable[int] | None) -> list[Path]:
        if not self.root.is_dir():
            raise StoreError(_not_a_store(self.given))
        wanted = None if steps is None else set(int(s) for s in steps)
        return [self.path_for(s) for s in self.steps() if wanted is None or s in wanted]

    def read(
        self, models: Iterable[str] | None = None, steps: Iterable[int] | None = None, columns: list[str] | None = None
    ) -> pa.Table:
        """Rows of the given models and steps (default: all), in step order, as one table."""
        models = None if models is None else list(models)
        filters = [("model", "in", models)] if models is not None else None
        parts = [_read_file(p, columns, filters) for p in self._files(steps)]
        target = pa.schema([SCHEMA.field(c) for c in (columns or SCHEMA.names)])
        if not parts:
            return target.empty_table()
        return pa.concat_tables(parts)

    def models(self) -> list[str]:
        """Model labels present in the store."""
        t = self.read(columns=["model"])
        return sorted(set(pc.unique(t["model"]).to_pylist())) if t.num_rows else []

    def resolve_model(self, model: str | None = None, exclude: str | None = None) -> str:
        """``model`` if the store has rows of it; with ``model=None`` the only model other than
        ``exclude`` in the store. Otherwise :class:`StoreError` listing the models present."""
        present = self.models()
        if model is not None:
            if model not in present:
                raise StoreError(f"{self.root}: no rows of model {model!r}; the store has {present}")
            return model
        candidates = [m for m in present if m != exclude]
        if len(candidates) != 1:
            raise StoreError(
                f"{self.root}: cannot pick the peer model automatically among {candidates} "
                f"(store has {present}); name it (peer.store_model)"
            )
        return candidates[0]

    def iter_groups(self, model: str | None = None) -> dict[str, list[StoredGroup]]:
        """All stored groups of ``model`` (``None``: the store's only model; an absent model is a
        :class:`StoreError`): prompt_id -> groups by increasing step."""
        model = self.resolve_model(model)
        out: dict[str, list[StoredGroup]] = {}
        for path in self._files(None):
            t = _read_file(path, None, [("model", "=", model)])
            if t.num_rows == 0:
                continue
            c = {name: t[name].to_pylist() for name in t.column_names}
            current: StoredGroup | None = None
            for r in range(t.num_rows):
                key = (c["step"][r], c["prompt_id"][r])
                if current is None or (current.step, current.prompt_id) != key or c["group_index"][r] == 0:
                    current = StoredGroup(
                        model=model,
                        tokenizer=c["tokenizer"][r],
                        run_id=c["run_id"][r],
                        step=c["step"][r],
                        epoch=c["epoch"][r],
                        prompt_id=c["prompt_id"][r],
                        problem=c["problem"][r],
                        answer=c["answer"][r],
                        prompt_text=c["prompt_text"][r],
                        messages=None if c["messages"][r] is None else tuple(json.loads(c["messages"][r])),
                    )
                    out.setdefault(current.prompt_id, []).append(current)
                current.responses.append(c["response"][r])
                current.token_ids.append(c["response_token_ids"][r])
                current.gen_logprobs.append(c["gen_logprobs"][r])
                current.finished.append(c["finished"][r])
                current.rewards.append(c["reward"][r])
                current.statuses.append(c["verify_status"][r])
                current.advantages.append(c["advantage"][r])
        for groups in out.values():
            groups.sort(key=lambda g: g.step)  # stable: equal steps keep file order
        return out


# ----------------------------------------------------------------------------- inspection


def info(path: str | Path, threshold: float) -> dict:
    """Summary of a store: models, tokenizer per model, steps, rows, reward rate (the share of rows whose reward is
    above ``threshold``, the run's ``reward.success_threshold``), size, schema version."""
    store = TrajectoryStore(path)
    files = store._files(None)
    if not files:
        raise StoreError(_not_a_store(store.given))
    cols = ["run_id", "model", "tokenizer", "step", "prompt_id", "reward", "verify_status"]
    t = store.read(columns=cols)
    size = sum(p.stat().st_size for p in files)
    models: dict[str, dict] = {}
    d = {c: t[c].to_pylist() for c in cols}
    for i in range(t.num_rows):
        m = models.setdefault(
            d["model"][i],
            {"tokenizer": d["tokenizer"][i], "rows": 0, "correct": 0, "prompts": set(), "steps": set(), "status": {}},
        )
        m["rows"] += 1
        m["correct"] += succeeded(d["reward"][i], threshold)
        m["prompts"].add(d["prompt_id"][i])
        m["steps"].add(d["step"][i])
        m["status"][d["verify_status"][i]] = m["status"].get(d["verify_status"][i], 0) + 1
    steps = store.steps()
    return {
        "path": str(store.given if store._only_step is not None else store.root),
        "schema_version": SCHEMA_VERSION,
        "run_ids": sorted(set(d["run_id"])),
        "files": len(files),
        "steps": [steps[0], steps[-1]] if steps else None,
        "rows": t.num_rows,
        "size_bytes": size,
        "models": {
            name: {
                "tokenizer": m["tokenizer"],
                "rows": m["rows"],
                "prompts": len(m["prompts"]),
                "steps": [min(m["steps"]), max(m["steps"])],
                "reward_rate": m["correct"] / m["rows"],
                "verify_status": dict(sorted(m["status"].items())),
            }
            for name, m in sorted(models.items())
        },
    }


def export_jsonl(path: str | Path, out: str | Path, models: Iterable[str] | None = None) -> int:
    """Write every row (all columns) as one JSON object per line; returns the number of rows.
    ``out`` appears only when the export succeeded."""
    store = TrajectoryStore(path)
    models = None if models is None else list(models)
    filters = [("model", "in", models)] if models is not None else None
    n = 0
    out = Path(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            for p in store._files(None):
                for row in _read_file(p, None, filters).to_pylist():
                    f.write(dumps_json(row) + "\n")
                    n += 1
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return n
