"""Experiment trackers: TensorBoard and W&B (offline) receive exactly what metrics.jsonl holds."""
from __future__ import annotations

import json
import struct
import time
import textwrap
from pathlib import Path

import pytest
import yaml

from graft.config import ConfigError, load_config
from graft.trainer import loop, tracking
from tests.trainer.helpers import crafted_rewards, tiny_config

ROWS = [{"id": f"v{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(2)]


def _val(tmp_path: Path) -> Path:
    p = tmp_path / "val.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return p


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _expected(rows: list[dict]) -> dict[str, dict[int, float]]:
    """tag -> {step: value} of every number in metrics.jsonl (null = NaN is not a number there)."""
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        for k, v in r.items():
            if k != "step" and isinstance(v, (int, float)):
                out.setdefault(k, {})[r["step"]] = v
    return out


# ----------------------------------------------------------------------------- pure parts

def test_scalars_keep_what_metrics_jsonl_stores_as_numbers():
    m = {"step": 3, "A/loss": 0.5, "A/peer_groups": 2, "complementarity/A->B": float("nan"),
         "eval/A/best_step": None, "x": float("inf")}
    assert tracking.scalars(m) == {"A/loss": 0.5, "A/peer_groups": 2}


def test_wandb_mode_without_key_is_offline(tmp_path):
    no_netrc = {"NETRC": str(tmp_path / "missing")}
    assert tracking.wandb_mode("auto", no_netrc) == "offline"
    assert tracking.wandb_mode("auto", {**no_netrc, "WANDB_API_KEY": "k"}) == "online"   # asked for; run_mode probes
    assert tracking.wandb_mode("auto", {**no_netrc, "WANDB_API_KEY": "k", "WANDB_MODE": "offline"}) == "offline"
    assert tracking.wandb_mode("offline", {"WANDB_API_KEY": "k"}) == "offline"
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    assert tracking.wandb_mode("auto", {"NETRC": str(netrc)}) == "online"


def test_unknown_tracker_names_the_field():
    with pytest.raises(ConfigError, match=r"logging\.report_to.*neptune"):
        load_config(None, ["models=[{name: A, path: x}]", "exchange.mode=grpo", "logging.report_to=[neptune]"])
    with pytest.raises(ConfigError, match=r"logging\.log_completions: must be >= 0"):
        load_config(None, ["models=[{name: A, path: x}]", "exchange.mode=grpo", "logging.log_completions=-1"])
    assert load_config(None, ["models=[{name: A, path: x}]", "exchange.mode=grpo",
                              "logging.report_to=tensorboard"]).logging.report_to == ["tensorboard"]


def test_missing_tracker_package_is_a_one_line_error_before_models_load(tmp_path, monkeypatch, capsys):
    import importlib.util

    from graft.commands.cli import main
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    run_dir = tmp_path / "run"
    rc = main(["train", str(Path(__file__).resolve().parents[2] / "configs" / "default.yaml"), f"run_dir={run_dir}",
               f"models.0.path={tmp_path / 'no-such-model'}", "logging.report_to=[tensorboard, wandb]"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err[-1].startswith("error:") and "'wandb' package is not installed" in err[-1] and "pip install wandb" in err[-1]
    assert "no-such-model" not in err[-1]   # reported before any model is looked at
    assert not run_dir.exists()


# ----------------------------------------------------------------------------- TensorBoard

def _read_tensorboard(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scal = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    texts = [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors("config/text_summary")]
    completions = {(t, e.step): e.tensor_proto.string_val[0].decode() for t in acc.Tags()["tensors"]
                   if t.startswith("completions/") for e in acc.Tensors(t)}
    return scal, texts, completions


def test_tensorboard_holds_the_metrics_jsonl_scalars_and_resume_does_not_duplicate(tmp_path, tiny_llama_dir,
                                                                                  tiny_gemma_dir, monkeypatch):
    crafted_rewards(monkeypatch)
    common = (f"data.val={_val(tmp_path)}", "eval.every=1", "eval.n=2", "eval.max_new_tokens=4",
              "checkpoint.save_every=1", "logging.report_to=[tensorboard]")
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=3", *common)
    loop.train(cfg)
    run_dir = Path(cfg.run_dir)
    # resume from step 2: step 3 runs again (other timings), TensorBoard must show it once, with the new values
    ck2 = run_dir / "checkpoints" / "step_000002"
    loop.train(tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=3", *common, f"resume={ck2}"))

    rows = _metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    expected = _expected(rows)
    assert "eval/A/val/pass@1" in expected and "B/reward/mean" in expected and "time/step_s" in expected
    scal, texts, completions = _read_tensorboard(run_dir / "tensorboard")
    assert set(scal) == set(expected)
    for tag, by_step in expected.items():
        got = scal[tag]
        assert [s for s, _ in got] == sorted(by_step), tag          # each step exactly once
        for s, v in got:
            assert v == pytest.approx(by_step[s], rel=1e-6, abs=1e-7), (tag, s)   # float32 in the event file
    # the resolved config as YAML text: once at step 0, once more at the resume (step 2)
    assert [s for s, _ in texts] == [0, 2]
    # logging.log_completions=2: a Markdown table of 2 completions per model and step
    assert sorted(completions) == [(f"completions/{m}/text_summary", s) for m in "AB" for s in (1, 2, 3)]
    table = completions[("completions/A/text_summary", 1)].splitlines()
    assert table[0] == "| step | model | prompt_id | prompt | completion | reward | advantage |" and len(table) == 4
    assert table[2].startswith("| 1 | A | arith-")
    assert yaml.safe_load(textwrap.dedent(texts[-1][1])) == yaml.safe_load((run_dir / "config.yaml").read_text())


# ----------------------------------------------------------------------------- W&B offline

def _wandb_records(path: Path):
    """Records of a ``.wandb`` file: a 7-byte ``:W&B`` header, then a LevelDB-style log (32 KiB blocks,
    records of crc32 (4) + length (2) + type (1: full, 2: first, 3: middle, 4: last) + payload)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString((buf + chunk) if kind == 4 else chunk)
            yield rec
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk


def _settled_wandb_records(path: Path, timeout_s: float = 60.0) -> list:
    """The file's records once W&B's service has written them all: ``run.finish()`` can return before its
    writer flushes the last history records (seen under load with wandb 0.31), so wait for the file to stop
    growing with an ``exit`` record in it."""
    deadline, size = time.monotonic() + timeout_s, -1
    while True:
        records = list(_wandb_records(path))
        settled = path.stat().st_size == size and any(r.WhichOneof("record_type") == "exit" for r in records)
        if settled or time.monotonic() > deadline:
            return records
        size = path.stat().st_size
        time.sleep(0.5)


def test_wandb_offline_without_a_key_holds_the_scalars_and_the_config(tmp_path, tiny_llama_dir, tiny_gemma_dir,
                                                                       monkeypatch, capsys):
    crafted_rewards(monkeypatch)
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, f"data.val={_val(tmp_path)}", "eval.every=2",
                      "eval.n=2", "eval.max_new_tokens=4", "logging.report_to=[wandb]")
    loop.train(cfg)
    run_dir = Path(cfg.run_dir)
    assert "W&B logs offline" in capsys.readouterr().err
    files = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    run_id = (run_dir / "wandb" / "graft_run_id").read_text().strip()
    assert files[0].name == f"run-{run_id}.wandb"

    history, config = {}, None
    for rec in _settled_wandb_records(files[0]):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            # W&B stores "a/b/c" keys split into nested_key
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            history[rec.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
        elif kind == "run":
            config = {i.key: json.loads(i.value_json) for i in rec.run.config.update if i.key != "_wandb"}
            assert rec.run.display_name == run_dir.name and rec.run.project == "graft"
    expected = _expected(_metrics(run_dir))
    assert "eval/A/val/pass@1" in expected
    assert sorted(history) == [1, 2]
    got = {}
    for step, items in history.items():
        for k, v in items.items():
            got.setdefault(k, {})[step] = v
    # logging.log_completions (default 2): a W&B table per model and step (stored as completions/M/_type, ...)
    tables = {k for k in got if k.startswith("completions/")}
    assert {k.split("/")[1] for k in tables} == {"A", "B"}
    assert all(sorted(got[f"completions/{m}/_type"]) == [1, 2] for m in "AB")
    assert {got[f"completions/{m}/_type"][s] for m in "AB" for s in (1, 2)} == {"table-file"}
    assert got["completions/A/nrows"] == {1: 2, 2: 2} and got["completions/B/nrows"] == {1: 2, 2: 2}
    assert {k: v for k, v in got.items() if k not in tables} == expected   # same keys, same steps, same values
    assert config == yaml.safe_load((run_dir / "config.yaml").read_text())


# ----------------------------------------------------------------------------- W&B host unreachable

def _closed_port() -> int:
    import socket
    with socket.socket() as s:   # bound then closed: nothing listens there, connections are refused at once
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_wandb_mode_follows_the_hosts_reachability(tmp_path, monkeypatch):
    import socket
    monkeypatch.setattr(tracking, "_WANDB_PROBES", {})
    key = {"NETRC": str(tmp_path / "missing"), "WANDB_API_KEY": "k"}
    closed = {**key, "WANDB_BASE_URL": f"http://127.0.0.1:{_closed_port()}"}
    assert tracking.run_mode("auto", closed) == "offline"
    assert tracking.run_mode("online", closed) == "online"            # asked for: check_trackers stops instead
    assert tracking.run_mode("auto", {**closed, "WANDB_MODE": "online"}) == "online"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert tracking.run_mode("auto", {**key, "WANDB_BASE_URL": f"http://127.0.0.1:{server.getsockname()[1]}"}) == "online"


def test_wandb_key_without_network_falls_back_offline_in_one_line_before_models_load(tmp_path, tiny_llama_dir,
                                                                                  tiny_gemma_dir, monkeypatch, capsys):
    import time

    from graft.commands.cli import main
    crafted_rewards(monkeypatch)
    monkeypatch.setattr(tracking, "_WANDB_PROBES", {})
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{_closed_port()}")
    # asked for online: one line, before any model is looked at (the model path does not exist)
    run_dir = tmp_path / "online"
    rc = main(["train", str(Path(__file__).resolve().parents[2] / "configs" / "default.yaml"), f"run_dir={run_dir}",
               f"models.0.path={tmp_path / 'no-such-model'}", "logging.report_to=[wandb]", "logging.wandb_mode=online"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith("error: logging.wandb_mode:") and "unreachable" in err[-1]
    assert "no-such-model" not in err[-1] and not run_dir.exists()
    # auto (the default): one line, then the run logs offline and does not wait for W&B
    t0 = time.perf_counter()
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=1", "logging.report_to=[wandb]")
    loop.train(cfg)
    assert time.perf_counter() - t0 < 120
    err = capsys.readouterr().err
    assert sum("W&B host is unreachable" in l and "W&B logs offline" in l for l in err.splitlines()) == 1
    assert len(list((Path(cfg.run_dir) / "wandb").glob("offline-run-*/run-*.wandb"))) == 1


# ----------------------------------------------------------------------------- MLflow (local file store)

def test_mlflow_key_is_what_mlflow_accepts():
    assert tracking.mlflow_key("exchange/A->B/admitted") == "exchange/A_to_B/admitted"
    assert tracking.mlflow_key("eval/A/val/pass@1") == "eval/A/val/pass_at_1"
    assert tracking.mlflow_key("models.0.lr") == "models.0.lr"


def test_mlflow_file_store_holds_the_metrics_config_and_completions_and_resume_continues_the_run(
        tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    crafted_rewards(monkeypatch)
    common = (f"data.val={_val(tmp_path)}", "eval.every=1", "eval.n=2", "eval.max_new_tokens=4",
              "checkpoint.save_every=1", "logging.report_to=[mlflow]", "logging.log_completions=1")
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=3", *common)
    loop.train(cfg)
    run_dir = Path(cfg.run_dir)
    run_id = (run_dir / "mlruns" / "graft_run_id").read_text().strip()
    ck2 = run_dir / "checkpoints" / "step_000002"
    loop.train(tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=3", *common, f"resume={ck2}"))
    assert (run_dir / "mlruns" / "graft_run_id").read_text().strip() == run_id    # the same MLflow run

    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    run = client.get_run(run_id)
    assert run.info.run_name == run_dir.name and run.info.status == "FINISHED"
    assert run.data.params["seed"] == "3" and run.data.params["models"].startswith("[")
    expected = _expected(_metrics(run_dir))
    assert set(run.data.metrics) == {tracking.mlflow_key(k) for k in expected}
    for k, by_step in expected.items():
        hist = client.get_metric_history(run_id, tracking.mlflow_key(k))
        last = {}
        for m in sorted(hist, key=lambda m: m.timestamp):   # step 3 was logged twice (before and after the resume)
            last[m.step] = m.value
        assert sorted(last) == sorted(by_step), k
        for s, v in last.items():
            assert v == pytest.approx(by_step[s], rel=1e-9, abs=1e-12), (k, s)
    art = Path(run.info.artifact_uri.removeprefix("file://"))
    assert yaml.safe_load((art / "config.yaml").read_text()) == yaml.safe_load((run_dir / "config.yaml").read_text())
    rows = json.loads((art / "completions" / "step_000001.json").read_text())
    assert sorted(rows) == ["A", "B"] and len(rows["A"]) == 1 and rows["A"][0]["step"] == 1
