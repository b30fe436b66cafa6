"""Atomic, resumable checkpoints.

Layout (one folder per saved step; ``{name}`` is a model label such as ``A``)::

    RUN_DIR/checkpoints/step_000010/
        {name}/                 Hugging Face folder written by the caller (``policy.save``):
                                config.json, model.safetensors (or adapter_*.safetensors for LoRA), tokenizer files
        {name}/optimizer.pt     ``optimizer.state_dict()`` (torch.save); absent with ``keep_optimizer="none"``
        state.pt                {"step", "rng", **state}: step counter, RNG states, sampler position, anything else
        config.yaml             the resolved run config
        manifest.json           written LAST: every other file with its size and sha256

    RUN_DIR/checkpoints/tokenizers/{name}-{hash}/
                                one copy of each tokenizer (``hash``: of its files' sha256s); the tokenizer
                                files in the step folders are hard links to it

Tokenizers never change during training, and Gemma's is 33 MB: every step folder stays a complete
Hugging Face folder (``from_pretrained`` loads model and tokenizer from it, the manifest lists and
hashes its tokenizer files), but the tokenizer's bytes are on disk once per run. A filesystem without
hard links gets a copy per step, as before.

Crash safety. Everything is written under ``checkpoints/.tmp-step_000010-<pid>/``; files and
folders are fsynced, then the folder is renamed to ``step_000010`` and ``checkpoints/`` is
fsynced. A kill at any moment therefore leaves either no new folder (only a ``.tmp-`` one,
which readers ignore and the next save deletes) or a complete one. Re-saving an existing
step moves the old folder aside to ``.old-step_000010-<pid>`` first; if a kill lands between
the two renames, readers fall back to that folder and the next save restores it.

A checkpoint is *complete* when ``manifest.json`` parses and every file it lists exists with
the recorded size. Loading checks that (cheap); ``verify="full"`` also re-hashes every file.
Pruning keeps the ``keep_last`` complete checkpoints with the highest steps (the one just
written is never pruned, nor any step in ``keep_steps``, e.g. the best-evaluated one); folders
are renamed to ``.del-...`` before deletion so a kill mid-delete never leaves a half-deleted
``step_*`` folder behind.

``keep_optimizer="last"``: after a save, every older checkpoint loses its ``{name}/optimizer.pt``
files. Its manifest is rewritten first (atomically: the files leave ``files`` and
``optimizers`` becomes empty), then the files are deleted, so a kill in between leaves a
complete checkpoint with a stray unlisted file, never one whose manifest lists a missing file.
Such a checkpoint still holds weights, RNG and sampler state (``graft export`` and ``graft eval``
use it) but cannot be resumed (the trainer refuses with a message).

``keep_optimizer="none"`` (weights only, TRL's ``save_only_model``): no optimizer file is written; such
checkpoints load for ``graft export`` and ``graft eval`` but cannot be resumed.

Resuming (:func:`newest_intact_checkpoint`) re-hashes every file: flipped bytes or a missing
file are reported by name; a damaged newest checkpoint is skipped with a warning in favour of an
older intact one, and no intact checkpoint at all is an error (never a silent fresh start).
A damaged tokenizer file is one inode shared by every step, so skipping would not help: the trainer
first calls :func:`restore_tokenizer_files`, which rewrites it in place from the model's own tokenizer
when that reproduces the recorded sha256.

``state.pt`` is loaded with ``torch.load(weights_only=True)``: ``state`` must hold plain data
(dict, list, tuple, str, int, float, bool, None, tensors). ``save_checkpoint`` checks that
before publishing the checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import random
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, Protocol

import numpy as np
import torch
import yaml
from safetensors import safe_open

from graft.errors import UserError
from graft.files import fsync_path, output_error, write_text, writing
from graft.registry import OPTIMIZER_KEEPS

FORMAT_VERSION = 1
"""Version of the checkpoint layout written into ``manifest.json``."""

_STEP_RE = re.compile(r"^step_(\d+)$")
_HIDDEN_RE = re.compile(r"^\.(tmp|old|del)-step_(\d+)-(\d+)$")
_RESERVED = {"state.pt", "config.yaml", "manifest.json"}


@dataclass(frozen=True)
class OptimizerKeep:
    """Which checkpoints hold optimizer state (``checkpoint.keep_optimizer``)."""

    writes: bool
    """A new checkpoint gets ``{name}/optimizer.pt``."""
    only_newest: bool
    """After a save, every older checkpoint loses its optimizer files (:func:`drop_optimizer_state`)."""


OPTIMIZER_KEEPS.register("all", OptimizerKeep(writes=True, only_newest=False))
OPTIMIZER_KEEPS.register("last", OptimizerKeep(writes=True, only_newest=True))
OPTIMIZER_KEEPS.register("none", OptimizerKeep(writes=False, only_newest=False))


class _HasStateDict(Protocol):
    """What a checkpoint needs of an optimizer (``torch.optim.Optimizer``, graft's ``LeanAdamW`` and the learner's
    wrapper all qualify)."""

    def state_dict(self) -> dict: ...


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
)
"""Files of a Hugging Face tokenizer (what ``save_pretrained`` writes for the tokenizers graft loads)."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be written or loaded; the message names the folder and file."""


# ----------------------------------------------------------------------------- RNG


def rng_state() -> dict:
    """States of Python ``random``, NumPy's global generator, torch CPU and (when available) CUDA.

    Plain data only (lists, tuples, tensors), so it survives ``torch.load(weights_only=True)``.
    """
    name, keys, pos, has_gauss, cached = np.random.get_state()
    out: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "name": str(name),
            "keys": [int(k) for k in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` captured. Missing entries are left alone; CUDA states are
    restored only when CUDA is available (for as many devices as both sides have)."""
    if "python" in state:
        v = state["python"]
        random.setstate((v[0], tuple(v[1]), v[2]))
    if "numpy" in state:
        n = state["numpy"]
        np.random.set_state((n["name"], np.asarray(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    if "torch" in state:
        torch.set_rng_state(state["torch"].cpu())
    if state.get("cuda") is not None and torch.cuda.is_available():
        states = list(state["cuda"])[: torch.cuda.device_count()]
        for i, s in enumerate(states):
            torch.cuda.set_rng_state(s.cpu(), i)


# ----------------------------------------------------------------------------- helpers


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            fsync_path(Path(dirpath) / f)
        fsync_path(Path(dirpath))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own leftovers (an earlier failed save in this process) are stale
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _read_manifest(path: Path) -> dict:
    mpath = path / "manifest.json"
    if not mpath.is_file():
        raise CheckpointError(f"{path}: not a complete checkpoint (no manifest.json; a write was interrupted?)")
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{mpath}: unreadable manifest: {e}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict) or "step" not in manifest:
        raise CheckpointError(f"{mpath}: malformed manifest (needs 'step' and 'files')")
    if manifest.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{mpath}: checkpoint format {manifest.get('format')!r}, this graft reads format {FORMAT_VERSION}")
    return manifest


def _verify(path: Path, manifest: dict, full: bool) -> None:
    for rel, meta in manifest["files"].items():
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise CheckpointError(f"{path}: manifest lists a file outside the checkpoint: {rel!r}")
        f = path / rel
        if not f.is_file():
            raise CheckpointError(f"{path}: file {rel} is missing (listed in manifest.json)")
        size = f.stat().st_size
        if size != meta.get("size"):
            raise CheckpointError(
                f"{path}: file {rel} has {size} bytes, manifest.json says {meta.get('size')} (truncated or replaced)"
            )
        if full and meta.get("sha256") and _sha256(f) != meta["sha256"]:
            raise CheckpointError(f"{path}: file {rel} does not match its sha256 in manifest.json (corrupt)")


def _link_tokenizer(root: Path, folder: Path, name: str) -> None:
    """Replace the tokenizer files the caller wrote into the model folder ``folder`` by hard links to
    ``root/tokenizers/NAME-HASH/`` (written once per content, atomically; a damaged copy is rewritten), so
    every step holds the complete Hugging Face folder but the bytes are stored once. Where the filesystem
    refuses hard links the written files stay (a copy per step, as before)."""
    files = {
        f: {"size": (folder / f).stat().st_size, "sha256": _sha256(folder / f)} for f in TOKENIZER_FILES if (folder / f).is_file()
    }
    if not files:
        return
    rel = f"tokenizers/{name}-{hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]}"
    store = root / rel
    try:
        _verify(root, {"files": {f"{rel}/{f}": m for f, m in files.items()}}, full=True)
    except CheckpointError:  # not there yet (or damaged): write it
        tmp, old = (root / "tokenizers" / f".{kind}-{store.name}-{os.getpid()}" for kind in ("tmp", "del"))
        _remove_tree(tmp)
        tmp.mkdir(parents=True)
        for f in files:
            with writing(tmp / f):
                shutil.copy2(folder / f, tmp / f)
        _fsync_tree(tmp)
        if store.exists():
            os.rename(store, old)
        os.rename(tmp, store)
        fsync_path(store.parent)
        _remove_tree(old)
    for f in files:
        try:
            os.link(store / f, folder / f".{f}.link")
        except OSError:
            return
        os.replace(folder / f".{f}.link", folder / f)


def is_complete(path: str | Path) -> bool:
    """True when ``path`` holds a manifest and every listed file with its recorded size."""
    try:
        _verify(Path(path), _read_manifest(Path(path)), full=False)
        return True
    except CheckpointError:
        return False


def _step_of(path: Path) -> int | None:
    m = _STEP_RE.match(path.name)
    return int(m.group(1)) if m else None


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, by increasing step. A step whose folder is missing but
    whose moved-aside ``.old-`` copy is complete (kill during a same-step replace) is listed
    by that copy."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found: dict[int, Path] = {}
    for p in root.iterdir():
        step = _step_of(p)
        if step is not None and p.is_dir() and is_complete(p):
            found[step] = p
    for p in root.iterdir():
        m = _HIDDEN_RE.match(p.name)
        if m and m.group(1) == "old" and int(m.group(2)) not in found and is_complete(p):
            found[int(m.group(2))] = p
    return [found[s] for s in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The complete checkpoint with the highest step in ``RUN_DIR/checkpoints``, or ``None``."""
    cks = list_checkpoints(run_dir)
    return cks[-1] if cks else None


def _cleanup(root: Path) -> None:
    """Delete leftovers of dead writers; restore a moved-aside checkpoint whose replacement never landed."""
    for p in list(root.iterdir()):
        m = _HIDDEN_RE.match(p.name)
        if not m:
            continue
        kind, step, pid = m.group(1), int(m.group(2)), int(m.group(3))
        if _pid_alive(pid):
            continue
        final = root / step_dir_name(step)
        if kind == "old" and not final.exists() and is_complete(p):
            os.rename(p, final)
        else:
            _remove_tree(p)
    tokenizers = root / "tokenizers"
    for p in list(tokenizers.iterdir()) if tokenizers.is_dir() else []:  # a tokenizer copy a dead writer left
        m = re.match(r"^\.(tmp|del)-.+-(\d+)$", p.name)
        if m and not _pid_alive(int(m.group(2))):
            _remove_tree(p)
    fsync_path(root)


def _prune(root: Path, keep_last: int, keep: Path, keep_steps: frozenset[int] = frozenset()) -> None:
    """Delete the complete checkpoints beyond the ``keep_last`` newest (not ``keep``, not ``keep_steps``); one that a
    reader holds (:func:`reading`) stays until a later save finds it free."""
    if keep_last < 1:
        return
    steps = {p: s for p in root.iterdir() if (s := _step_of(p)) is not None and p.is_dir() and is_complete(p)}
    complete = sorted(steps, key=steps.__getitem__)
    doomed = [p for p in complete[: max(0, len(complete) - keep_last)] if p != keep and steps[p] not in keep_steps]
    for p in doomed:
        with _unread(p) as free:
            if free:
                trash = root / f".del-{p.name}-{os.getpid()}"
                os.rename(p, trash)
                fsync_path(root)
                _remove_tree(trash)


@contextlib.contextmanager
def _unread(path: Path) -> Iterator[bool]:
    """Whether no reader holds checkpoint ``path`` (:func:`reading`); while inside, none can take it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            free = True
        except BlockingIOError:
            free = False
        except OSError:  # a file system without flock: nothing can hold it
            free = True
        yield free
    finally:
        os.close(fd)


@contextlib.contextmanager
def reading(path: str | Path) -> Iterator[Path]:
    """Hold the checkpoint folder ``path`` (``RUN/checkpoints/step_N``) while reading it, e.g. ``graft eval`` of a run
    still training: pruning leaves a held checkpoint alone until it is released (a shared ``flock`` on the folder).
    A :class:`CheckpointError` when it is no longer there (pruned before it could be held)."""
    path = Path(path)
    gone = CheckpointError(f"{path}: no longer there (pruned by the training that writes it?)")
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        raise gone from None
    try:
        with contextlib.suppress(OSError):  # a file system without flock: read unheld, as before
            fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            here = os.stat(path).st_ino == os.fstat(fd).st_ino
        except OSError:
            here = False
        if not here:  # renamed for deletion between open and lock
            raise gone
        yield path
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- save


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    models: dict[str, Callable[[Path], None]],
    optimizers: Mapping[str, _HasStateDict],
    state: dict,
    config: dict | Any,
    keep_last: int = 2,
    hash_files: bool = True,
    keep_optimizer: str = "all",
    keep_steps: Iterable[int] = (),
) -> Path:
    """Write ``RUN_DIR/checkpoints/step_{step:06d}`` atomically and prune to ``keep_last``.

    ``models[name](folder)`` writes model ``name``'s Hugging Face folder into ``folder`` (pass
    ``policy.save``); ``optimizers[name].state_dict()`` goes to ``{name}/optimizer.pt``.
    ``state`` is stored in ``state.pt`` together with ``step`` and, unless ``state`` has an
    ``"rng"`` entry already, :func:`rng_state` (capture it *before* anything consumes random
    numbers after the step, i.e. call this at the end of the step). ``config`` is a dict or a
    config dataclass. ``keep_last < 1`` keeps every checkpoint; steps in ``keep_steps`` (the
    best-evaluated ones) are never pruned. ``keep_optimizer="last"`` removes the optimizer files
    of every older checkpoint (:func:`drop_optimizer_state`); ``"none"`` writes none (weights only,
    not resumable; ``optimizers`` is not read). Tokenizer files a writer puts in a model folder become
    hard links to the run's one copy (:func:`_link_tokenizer`). ``hash_files`` records sha256
    of each file in the manifest (costs one read of the checkpoint).

    Any exception from a writer propagates after the temporary folder is removed; earlier
    checkpoints are untouched. Returns the final folder.
    """
    tree: dict = config
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        tree = json.loads(json.dumps(dataclasses.asdict(config)))
    keep = OPTIMIZER_KEEPS[keep_optimizer]
    if not keep.writes:
        optimizers = {}
    for name in list(models) + list(optimizers):
        if not name or "/" in name or name.startswith(".") or name in _RESERVED:
            raise CheckpointError(f"invalid model name for a checkpoint folder: {name!r}")
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    _cleanup(root)
    name = step_dir_name(step)
    tmp = root / f".tmp-{name}-{os.getpid()}"
    _remove_tree(tmp)
    tmp.mkdir()
    try:
        _write_contents(tmp, root, step, models, optimizers, state, tree)
        _write_manifest(tmp, _file_manifest(tmp, step, models, optimizers, hash_files))
    except BaseException:
        _remove_tree(tmp)
        raise
    final = _publish(root, tmp, name)
    _prune(root, keep_last, keep=final, keep_steps=frozenset(int(s) for s in keep_steps))
    if keep.only_newest:
        for p in list_checkpoints(run_dir):
            if p != final:
                drop_optimizer_state(p)
    return final


def _write_contents(
    tmp: Path,
    root: Path,
    step: int,
    models: dict[str, Callable[[Path], None]],
    optimizers: Mapping[str, _HasStateDict],
    state: dict,
    config: dict,
) -> None:
    """Model folders, optimizer states, ``state.pt`` (checked to reload) and ``config.yaml`` into ``tmp``."""
    for mname, writer in models.items():
        (tmp / mname).mkdir(exist_ok=True)
        with writing(tmp / mname):
            writer(tmp / mname)
        _link_tokenizer(root, tmp / mname, mname)
    for mname, opt in optimizers.items():
        (tmp / mname).mkdir(exist_ok=True)
        with writing(tmp / mname / "optimizer.pt"):
            torch.save(opt.state_dict(), tmp / mname / "optimizer.pt")
    payload = dict(state)
    payload.setdefault("rng", rng_state())
    payload["step"] = int(step)
    try:
        torch.save(payload, tmp / "state.pt")
        torch.load(tmp / "state.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - report what cannot be reloaded, at save time
        raise output_error(e, tmp / "state.pt") or CheckpointError(
            f"state for step {step} cannot be saved and reloaded with torch.load(weights_only=True); "
            f"store plain data (dicts, lists, numbers, strings, tensors): {e}"
        ) from None
    write_text(tmp / "config.yaml", yaml.safe_dump(config, sort_keys=False))


def _file_manifest(tmp: Path, step: int, models: Mapping, optimizers: Mapping, hash_files: bool) -> dict:
    """The manifest of the finished folder ``tmp``: every file (size, sha256 with ``hash_files``), after fsyncing them."""
    files = {}
    for f in sorted(p for p in tmp.rglob("*") if p.is_file()):
        rel = f.relative_to(tmp).as_posix()
        files[rel] = {"size": f.stat().st_size, **({"sha256": _sha256(f)} if hash_files else {})}
    _fsync_tree(tmp)
    return {
        "format": FORMAT_VERSION,
        "step": int(step),
        "created_unix": time.time(),
        "models": sorted(models),
        "optimizers": sorted(optimizers),
        "files": files,
    }


def _publish(root: Path, tmp: Path, name: str) -> Path:
    """Rename the finished ``tmp`` to ``root/name`` atomically (replacing an existing one of that step)."""
    final = root / name
    if final.exists():
        old = root / f".old-{name}-{os.getpid()}"
        _remove_tree(old)
        os.rename(final, old)
        fsync_path(root)
        os.rename(tmp, final)
        fsync_path(root)
        _remove_tree(old)
    else:
        os.rename(tmp, final)
    fsync_path(root)
    return final


def _write_manifest(path: Path, manifest: dict) -> None:
    """Replace ``path/manifest.json`` atomically (temporary file, fsync, rename, fsync the folder)."""
    tmp = path / f".manifest.json.{os.getpid()}.tmp"
    with writing(path / "manifest.json"), open(tmp, "w") as fh:
        json.dump(manifest, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path / "manifest.json")
    fsync_path(path)


def drop_optimizer_state(path: str | Path) -> list[str]:
    """Remove the ``{name}/optimizer.pt`` files of the checkpoint at ``path``; returns their relative paths.

    The manifest is rewritten first (without those files, ``optimizers`` empty), then the files
    are deleted: the checkpoint stays complete at every moment."""
    path = Path(path)
    manifest = _read_manifest(path)
    names = list(manifest.get("optimizers", []))
    rels = [f"{n}/optimizer.pt" for n in names]
    if not names:
        return []
    manifest = {**manifest, "optimizers": [], "files": {rel: meta for rel, meta in manifest["files"].items() if rel not in rels}}
    _write_manifest(path, manifest)
    for rel in rels:
        (path / rel).unlink(missing_ok=True)
    return rels


def checkpoint_step(path: str | Path) -> int:
    """The step of a checkpoint folder (from its manifest)."""
    return int(_read_manifest(Path(path))["step"])


def remove_checkpoints_after(run_dir: str | Path, step: int) -> list[Path]:
    """Delete checkpoints with a step > ``step`` (resuming from an older checkpoint starts a new
    timeline; later checkpoints belong to the old one). Returns the deleted folders."""
    root = Path(run_dir) / "checkpoints"
    gone: list[Path] = []
    if not root.is_dir():
        return gone
    for p in sorted(root.iterdir()):
        s = _step_of(p)
        if s is not None and s > step and p.is_dir():
            trash = root / f".del-{p.name}-{os.getpid()}"
            os.rename(p, trash)
            fsync_path(root)
            _remove_tree(trash)
            gone.append(p)
    return gone


# ----------------------------------------------------------------------------- load


@dataclass
class Checkpoint:
    """A validated checkpoint folder."""

    path: Path
    step: int
    state: dict
    """Everything saved in ``state.pt``: ``step``, ``rng`` and the caller's own keys."""
    config: dict
    """The config as saved in ``config.yaml``."""
    model_dirs: dict[str, Path]
    """Model name -> its Hugging Face folder (``from_pretrained``-loadable)."""
    optimizer_names: list[str] = field(default_factory=list)
    manifest: dict = field(default_factory=dict)

    @property
    def rng(self) -> dict | None:
        """The RNG states to pass to :func:`set_rng_state`."""
        return self.state.get("rng")

    def optimizer_state(self, name: str, map_location: str | torch.device = "cpu") -> dict:
        """The saved ``optimizer.state_dict()`` of model ``name`` (for ``optimizer.load_state_dict``)."""
        if name not in self.optimizer_names:
            raise CheckpointError(f"{self.path}: no optimizer state for model {name!r} (have {self.optimizer_names})")
        f = self.path / name / "optimizer.pt"
        try:
            return torch.load(f, map_location=map_location, weights_only=True)
        except Exception as e:  # noqa: BLE001
            raise CheckpointError(f"{f}: cannot load optimizer state: {e}") from None


def load_checkpoint(path: str | Path, verify: Literal["size", "full"] = "size") -> Checkpoint:
    """Validate and open a checkpoint folder.

    ``path`` is a ``step_*`` folder, or a run folder / its ``checkpoints`` folder (then the latest
    complete checkpoint is used). ``verify="size"`` checks every manifest file exists with its
    recorded size; ``"full"`` also compares sha256. Any problem raises :class:`CheckpointError`
    naming the file.
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"checkpoint not found: {p}")
    if not (p / "manifest.json").exists():
        run_dir = p.parent if p.name == "checkpoints" else p
        if (run_dir / "checkpoints").is_dir():
            latest = latest_checkpoint(run_dir)
            if latest is None:
                raise CheckpointError(f"{run_dir / 'checkpoints'}: no complete checkpoint")
            p = latest
    manifest = _read_manifest(p)
    _verify(p, manifest, full=(verify == "full"))
    try:
        state = torch.load(p / "state.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"{p / 'state.pt'}: cannot load: {e}") from None
    try:
        config = yaml.safe_load((p / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise CheckpointError(f"{p / 'config.yaml'}: cannot load: {e}") from None
    models = list(manifest.get("models", []))
    return Checkpoint(
        path=p,
        step=int(manifest["step"]),
        state=state,
        config=config,
        model_dirs={m: p / m for m in models},
        optimizer_names=list(manifest.get("optimizers", [])),
        manifest=manifest,
    )


def verify_model_files(model_dir: str | Path) -> None:
    """Re-hash the files of one model folder of a checkpoint (``RUN/checkpoints/step_N/NAME``)
    against the step's manifest (``optimizer.pt`` is not read). A missing, resized or changed
    file, or weights holding NaN/inf, raise :class:`CheckpointError` naming it."""
    model_dir = Path(model_dir)
    step_dir = model_dir.parent
    manifest = _read_manifest(step_dir)
    prefix = model_dir.name + "/"
    files = {rel: meta for rel, meta in manifest["files"].items() if rel.startswith(prefix) and rel != prefix + "optimizer.pt"}
    if not files:
        raise CheckpointError(
            f"{step_dir}: manifest.json lists no files of model {model_dir.name!r} "
            f"(models: {', '.join(manifest.get('models', [])) or 'none'})"
        )
    _verify(step_dir, {"files": files}, full=True)
    bad = [f"{rel}:{name}" for rel in sorted(files) if rel.endswith(".safetensors") for name in nonfinite_tensors(step_dir / rel)]
    if bad:
        raise CheckpointError(
            f"{model_dir}: weights hold NaN or inf ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); "
            "the run that wrote it diverged; use an earlier checkpoint"
        )


def nonfinite_tensors(path: str | Path) -> list[str]:
    """Names of the floating-point tensors of a safetensors file holding NaN or inf (read one at a time)."""

    with safe_open(str(path), framework="pt") as f:
        return [k for k in f.keys() if (t := f.get_tensor(k)).is_floating_point() and not bool(torch.isfinite(t).all())]


def _step_folders(root: Path) -> dict[int, Path]:
    """Step -> folder of every ``step_*`` folder in ``root`` (complete or not), and of a complete ``.old-`` copy
    whose step has no folder (a same-step replace killed between its two renames)."""
    found: dict[int, Path] = {}
    for p in root.iterdir():
        step = _step_of(p)
        if step is not None and p.is_dir():
            found[step] = p
    for p in root.iterdir():
        m = _HIDDEN_RE.match(p.name)
        if m and m.group(1) == "old" and int(m.group(2)) not in found and is_complete(p):
            found[int(m.group(2))] = p
    return found


def _tokenizer_entries(folder: Path) -> list[tuple[str, str, dict]]:
    """``(model, file name, manifest entry)`` of each hashed tokenizer file the manifest of ``folder`` lists."""
    try:
        files = _read_manifest(folder)["files"]
    except CheckpointError:
        return []
    return [
        (*rel.split("/"), meta)
        for rel, meta in files.items()
        if rel.count("/") == 1 and rel.split("/")[1] in TOKENIZER_FILES and meta.get("sha256")
    ]


def _intact(path: Path, meta: dict) -> bool:
    return path.is_file() and path.stat().st_size == meta.get("size") and _sha256(path) == meta["sha256"]


def _rewrite_in_place(path: Path, data: bytes) -> None:
    """Write ``data`` into ``path``'s own inode (``O_TRUNC``, no new file), so every hard link to it sees the bytes."""
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def restore_tokenizer_files(run_dir: str | Path, source: Callable[[str], Path | None]) -> list[str]:
    """Mend the tokenizer files of the run's checkpoints that no longer match their manifest's sha256.

    ``source(model)`` is a folder holding that model's tokenizer as freshly saved (``None``: no source). A
    damaged (or missing) file is rewritten from the same-named file there, only when that file has exactly the
    recorded sha256 and size. The rewrite is in place: tokenizer files are hard links into
    ``checkpoints/tokenizers/`` (one inode for every step), so one rewrite mends the run's copy and every step
    folder at once. Returns one notice line per rewritten file; a file that cannot be restored is left alone
    for :func:`newest_intact_checkpoint` to report."""
    root = Path(run_dir) / "checkpoints"
    folders = _step_folders(root) if root.is_dir() else {}
    sources: dict[str, Path | None] = {}
    checked: set[tuple[int, int]] = set()
    notices: list[str] = []
    for step in sorted(folders, reverse=True):
        for model, name, meta in _tokenizer_entries(folders[step]):
            path = folders[step] / model / name
            inode = (path.stat().st_dev, path.stat().st_ino) if path.is_file() else None
            if inode in checked:
                continue
            if inode is not None:
                checked.add(inode)
            if _intact(path, meta):
                continue
            if model not in sources:
                sources[model] = source(model)
            src = sources[model]
            if src is not None and _intact(src / name, meta):
                _rewrite_in_place(path, (src / name).read_bytes())
                notices.append(
                    f"resume: restored {path} (damaged; {path.stat().st_nlink} hard link(s) under {root}) "
                    f"from model {model}'s tokenizer, whose bytes match the sha256 in the manifest"
                )
    return notices


def newest_intact_checkpoint(run_dir: str | Path) -> tuple[Checkpoint | None, list[str]]:
    """The newest checkpoint of ``run_dir`` whose every file matches its manifest (sha256), and one
    warning line per newer checkpoint that was skipped as damaged.

    ``(None, [])`` when the run has no checkpoint folder at all. Raises :class:`CheckpointError`
    naming the damaged file when checkpoints exist but none is intact.
    """
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return None, []
    found = _step_folders(root)
    damaged: list[str] = []
    for step in sorted(found, reverse=True):
        try:
            ckpt = load_checkpoint(found[step], verify="full")
        except CheckpointError as e:
            damaged.append(str(e))
            continue
        return ckpt, [f"warning: skipping damaged checkpoint: {d}; resuming from {ckpt.path} instead" for d in damaged]
    if not damaged:
        return None, []
    more = f" (and {len(damaged) - 1} older damaged checkpoint(s))" if len(damaged) > 1 else ""
    raise CheckpointError(
        f"{damaged[0]}{more}; {root} holds no intact checkpoint to resume from and nothing was "
        "changed; to start over pass resume=restart (deletes this run's metrics, audit log, "
        "trajectories and checkpoints) or choose another run_dir"
    )
