"""Trajectory store: round trip, atomic replace, truncation, corrupt inputs, group selection, CLI."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from graft.commands.store import store_main
from graft.storage.trajectory_store import (
    SCHEMA, SCHEMA_VERSION, StoredGroup, StoreError, TrajectoryStore, export_jsonl, info, select_stored_group,
)

TOK = {"A": "tok-a", "B": "tok-b"}


def _fill(store: TrajectoryStore, group_factory, steps=(0, 1, 2)) -> None:
    for step in steps:
        groups = [
            group_factory("A", "p1", [0, 1, 0, 0], step),
            group_factory("A", "p2", [1, 1, 1, 1], step),
            group_factory("B", "p1", [0, 0, 0, 0], step),
            group_factory("A", "p1", [0, 0, 0, 0], step, holder="B"),  # peer copy: not a row
        ]
        peer_use = {("A", "p1", 1): [("B", True, 0.9)], ("A", "p1", 0): [("B", False, 0.0)]}
        store.write_step(step, epoch=step // 2, groups=groups, tokenizer_names=TOK, peer_use=peer_use)


def test_round_trip(tmp_path, group_factory):
    store = TrajectoryStore(tmp_path / "traj", run_id="run-1")
    _fill(store, group_factory)
    assert store.steps() == [0, 1, 2]
    t = store.read()
    assert t.num_rows == 3 * 12 and t.schema.names == SCHEMA.names
    assert store.models() == ["A", "B"]
    assert store.read(models=["B"], steps=[1]).num_rows == 4
    meta = pq.read_schema(store.path_for(0)).metadata
    assert meta[b"graft.schema_version"] == str(SCHEMA_VERSION).encode() and meta[b"graft.run_id"] == b"run-1"

    rows = [r for r in store.read(models=["A"], steps=[1]).to_pylist() if r["prompt_id"] == "p1"]
    assert [r["group_index"] for r in rows] == [0, 1, 2, 3] and {r["group_size"] for r in rows} == {4}
    assert rows[1]["used_as_peer_by"] == ["B"] and rows[1]["admitted_by"] == ["B"] and rows[1]["weight_by"] == [0.9]
    assert rows[0]["used_as_peer_by"] == ["B"] and rows[0]["admitted_by"] == [] and rows[0]["weight_by"] == [0.0]
    assert rows[2]["used_as_peer_by"] == [] and rows[2]["weight_by"] == []
    assert rows[0]["epoch"] == 0 and rows[0]["tokenizer"] == "tok-a" and rows[0]["run_id"] == "run-1"

    src = group_factory("A", "p1", [0, 1, 0, 0], 2)
    groups = store.iter_groups("A")
    assert sorted(groups) == ["p1", "p2"] and [g.step for g in groups["p1"]] == [0, 1, 2]
    g = groups["p1"][2]
    assert (g.model, g.tokenizer, g.step, g.epoch, g.prompt_text) == ("A", "tok-a", 2, 1, src.prompt_text)
    assert g.responses == src.responses and g.token_ids == src.gen_token_ids and g.finished == src.finished
    assert g.rewards == src.rewards and g.statuses == src.status and g.advantages == src.advantages
    for a, b in zip(g.gen_logprobs, src.gen_logprobs):
        assert a == pytest.approx(b, abs=1e-6)  # stored as float32
    assert g.successes(0.5) == 1 and g.size == 4
    with pytest.raises(StoreError, match=r"no rows of model 'nobody'; the store has \['A', 'B'\]"):
        store.iter_groups("nobody")
    with pytest.raises(StoreError, match="cannot pick the peer model automatically"):
        store.iter_groups()
    assert store.resolve_model(None, exclude="A") == "B"
    only_b = TrajectoryStore(tmp_path / "only_b", run_id="r")
    only_b.write_step(3, 1, [group_factory("B", "p7", [0, 1], 3)], TOK)
    assert list(only_b.iter_groups()) == ["p7"] and only_b.iter_groups()["p7"][0].model == "B"


def test_rewrite_replaces_step_without_duplicates(tmp_path, group_factory):
    store = TrajectoryStore(tmp_path, run_id="r")
    _fill(store, group_factory, steps=(0, 1))
    store.write_step(1, 0, [group_factory("B", "p9", [1, 0], 1)], TOK)
    t = store.read(steps=[1])
    assert t.num_rows == 2 and set(t["prompt_id"].to_pylist()) == {"p9"}
    assert store.read().num_rows == 12 + 2
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_empty_step_and_empty_store(tmp_path, group_factory):
    store = TrajectoryStore(tmp_path / "s", run_id="r")
    with pytest.raises(StoreError, match="no trajectory store"):
        store.read()
    store.write_step(0, 0, [], TOK)
    assert store.steps() == [0] and store.read().num_rows == 0 and store.models() == []
    with pytest.raises(StoreError, match="no rows of model 'A'"):
        store.iter_groups("A")


def test_truncate_after(tmp_path, group_factory):
    store = TrajectoryStore(tmp_path, run_id="r")
    _fill(store, group_factory, steps=(0, 1, 2, 3))
    assert store.truncate_after(1) == [2, 3]
    assert store.steps() == [0, 1]
    assert store.truncate_after(5) == []


def test_tmp_files_are_invisible_and_cleaned(tmp_path, group_factory):
    store = TrajectoryStore(tmp_path, run_id="r")
    _fill(store, group_factory, steps=(0,))
    stale = tmp_path / ".step_000001.parquet.999999999.tmp"
    stale.write_bytes(b"PAR1 half a file")
    assert store.steps() == [0] and store.read().num_rows == 12
    store.write_step(1, 0, [], TOK)
    assert not stale.exists()


def test_write_errors(tmp_path, group_factory):
    with pytest.raises(StoreError, match="run_id"):
        TrajectoryStore(tmp_path).write_step(0, 0, [], TOK)
    store = TrajectoryStore(tmp_path, run_id="r")
    with pytest.raises(StoreError, match="no tokenizer name given for model 'C'"):
        store.write_step(0, 0, [group_factory("C", "p", [0, 1])], TOK)
    unscored = group_factory("A", "p", [0, 1])
    unscored.rewards = []
    with pytest.raises(StoreError, match="score the group"):
        store.write_step(0, 0, [unscored], TOK)
    assert store.steps() == []


def _rewrite(path, table, metadata):
    pq.write_table(table.replace_schema_metadata(metadata), path)


def test_schema_version_mismatch(tmp_path, group_factory):
    store = TrajectoryStore(tmp_path, run_id="r")
    _fill(store, group_factory, steps=(0,))
    path = store.path_for(0)
    t = pq.read_table(path)
    _rewrite(path, t, {**t.schema.metadata, b"graft.schema_version": b"99"})
    with pytest.raises(StoreError, match=f"step_000000.parquet: trajectory store schema version 99, this graft reads version {SCHEMA_VERSION}"):
        store.read()
    _rewrite(path, t, {})
    with pytest.raises(StoreError, match="no graft schema version"):
        store.read()


def test_truncated_parquet(tmp_path, group_factory):
    store = TrajectoryStore(tmp_path, run_id="r")
    _fill(store, group_factory, steps=(0, 1))
    path = store.path_for(1)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(StoreError, match=r"step_000001\.parquet: not a readable Parquet file"):
        store.read()
    with pytest.raises(StoreError, match=r"step_000001\.parquet"):
        store.iter_groups("A")
    assert store.read(steps=[0]).num_rows == 12  # other steps still readable on their own


def test_missing_column(tmp_path, group_factory):
    store = TrajectoryStore(tmp_path, run_id="r")
    _fill(store, group_factory, steps=(0,))
    path = store.path_for(0)
    t = pq.read_table(path)
    _rewrite(path, t.drop_columns(["gen_logprobs"]), t.schema.metadata)
    with pytest.raises(StoreError, match=r"missing column\(s\) \['gen_logprobs'\]"):
        store.read()


def _g(step: int, k: int, n: int = 4) -> StoredGroup:
    return StoredGroup(model="A", tokenizer="t", run_id="r", step=step, epoch=0, prompt_id="p", problem="", answer="",
                       prompt_text="", responses=[""] * n, rewards=[1.0] * k + [0.0] * (n - k))


def test_select_stored_group():
    groups = [_g(0, 3), _g(2, 1), _g(5, 2), _g(7, 4)]
    assert select_stored_group(groups, 4, "latest").step == 2
    assert select_stored_group(groups, 5, "latest").step == 5
    assert select_stored_group(groups, 100, "latest").step == 7
    assert select_stored_group([_g(3, 1)], 2, "latest") is None
    assert select_stored_group(groups, 5, "same_step").step == 5
    assert select_stored_group(groups, 4, "same_step") is None
    assert select_stored_group(groups, 0, "any", threshold=0.5).step == 7  # most successes, even from a later step
    mixed = lambda g: 1 <= g.successes(0.5) < g.size  # noqa: E731
    assert select_stored_group(groups, 0, "any", eligible=mixed, threshold=0.5).step == 0
    assert select_stored_group(groups, 100, "latest", eligible=mixed).step == 5
    assert select_stored_group([_g(1, 2), _g(4, 2)], 0, "any", threshold=0.5).step == 4  # tie on successes -> latest
    dup_a, dup_b = _g(3, 1), _g(3, 2)
    assert select_stored_group([dup_a, dup_b], 3, "same_step") is dup_b  # equal step: later entry
    assert select_stored_group([], 3, "latest") is None
    with pytest.raises(ValueError, match="pick"):
        select_stored_group(groups, 0, "best")


def test_info_export_and_cli(tmp_path, group_factory, capsys):
    run = tmp_path / "run"
    store = TrajectoryStore(run / "trajectories", run_id="run-1")
    _fill(store, group_factory)
    d = info(run, 0.5)  # a run folder resolves to its trajectories/
    assert d["rows"] == 36 and d["steps"] == [0, 2] and d["files"] == 3 and d["run_ids"] == ["run-1"]
    assert d["schema_version"] == SCHEMA_VERSION and d["size_bytes"] > 0
    assert d["models"]["A"]["tokenizer"] == "tok-a" and d["models"]["A"]["rows"] == 24
    assert d["models"]["A"]["reward_rate"] == pytest.approx(5 / 8) and d["models"]["B"]["reward_rate"] == 0.0
    assert d["models"]["A"]["prompts"] == 2 and d["models"]["A"]["steps"] == [0, 2]

    assert store_main(["info", str(run / "trajectories")]) == 0
    out = capsys.readouterr().out
    assert "rows:           36" in out and "steps:          0..2 (3 files)" in out and f"schema version: {SCHEMA_VERSION}" in out
    line_a = next(line for line in out.splitlines() if line.startswith("A "))
    assert "tok-a" in line_a and "24" in line_a and "0.625" in line_a

    assert store_main(["info", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 36

    out_file = tmp_path / "b.jsonl"
    assert store_main(["export", str(run), str(out_file), "--model", "B"]) == 0
    assert "wrote 12 rows" in capsys.readouterr().out
    rows = [json.loads(x) for x in out_file.read_text().splitlines()]
    assert len(rows) == 12 and {r["model"] for r in rows} == {"B"} and set(rows[0]) == set(SCHEMA.names)
    assert export_jsonl(run, tmp_path / "all.jsonl") == 36

    assert store_main(["info", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith("error: no trajectory store at")
    data = store.path_for(2).read_bytes()
    store.path_for(2).write_bytes(data[:20])
    out_file.unlink()
    assert store_main(["export", str(run), str(out_file)]) == 2
    assert not out_file.exists() and not list(tmp_path.glob(".*.tmp"))  # no partial export left behind
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "step_000002.parquet" in err and "Traceback" not in err
    assert store_main(["bogus"]) == 2
    capsys.readouterr()


def test_a_conversation_is_stored_and_read_back_and_an_older_file_reads_none(tmp_path, group_factory):
    from dataclasses import replace

    from graft.exchange.stored import as_rollout_group
    talk = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is p1?"})
    store = TrajectoryStore(tmp_path, run_id="r")
    chat = replace(group_factory("A", "p1", [0, 1, 0, 0], 0), messages=talk)
    store.write_step(0, 0, [chat, group_factory("A", "p2", [1, 1, 1, 1], 0)], TOK)
    rows = store.read().to_pylist()
    assert {r["prompt_id"]: r["messages"] for r in rows} == {"p1": json.dumps(list(talk)), "p2": None}
    groups = store.iter_groups("A")
    assert groups["p1"][0].messages == talk and groups["p2"][0].messages is None
    assert as_rollout_group(groups["p1"][0]).messages == talk      # a stored peer's receiver renders the messages
    path = store.path_for(0)                                       # a file written before the messages column
    t = pq.read_table(path)
    _rewrite(path, t.drop_columns(["messages"]), t.schema.metadata)
    assert store.read().column("messages").to_pylist() == [None] * 8
    assert store.iter_groups("A")["p1"][0].messages is None
    assert store.read(columns=["prompt_id", "messages"]).num_rows == 8
