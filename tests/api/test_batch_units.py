"""The batch runner's pure parts: fair shares between tenants, reading an input file from a
cursor, merging part files (a torn line dropped, one line per request id, output before error),
the record's round trip through its Redis hash, and a line's validation."""

from __future__ import annotations

import json
from pathlib import Path

from api.batches import lines
from api.batches.input import read_at, read_from, validate
from api.batches.parts import error_part, output_part
from api.batches.records import BatchRecord
from api.batches.run.fair import shares
from api.batches.run.feeder import Running, fits
from api.batches.run.finalize import merge
from api.batches.run.placement import Room
from api.files.store import DirStore


def test_shares_follow_weights_and_what_runs_already() -> None:
    assert shares({"a": 0, "b": 0}, {"a": 2.0, "b": 1.0}, 9) == {"a": 6, "b": 3}
    assert shares({"a": 10, "b": 0}, {}, 4) == {"a": 0, "b": 4}, "a tenant that holds many gets none"
    assert shares({"a": 3, "b": 0}, {}, 5) == {"a": 1, "b": 4}
    assert shares({}, {}, 5) == {} and shares({"a": 0}, {}, 0) == {"a": 0}


def test_lines_go_to_the_routers_worker_while_it_has_seats_else_the_freest() -> None:
    lines = [Running(0, ["a", "b", "c"], 0.0, "w1"), Running(9, ["d"], 0.0)]
    room = Room.of(8, {"w1": 4, "w2": 4}, ((line.worker, len(line.jobs)) for line in lines))
    assert room.free == {"w1": 1, "w2": 4}  # a line in the shared queue is on no worker's seats
    assert room.place("w1", 1) == "w1", "the router's pick (it holds the prefix) while it has a seat"
    assert room.place("w1", 1) == "w2" and room.place("gone", 2) == "w2"
    assert room.place(None, 1) == "w2" and room.free == {"w1": 0, "w2": 0}
    assert Room.of(0, {}, []).place("w1", 1) is None


def test_a_line_fits_its_seats_or_runs_alone_when_larger_than_the_window() -> None:
    assert fits(3, 3, 64, idle=False) and not fits(4, 3, 64, idle=False)
    assert not fits(40, 10, 32, idle=False) and fits(40, 10, 32, idle=True)
    assert not fits(30, 10, 32, idle=True), "it fits the window: it waits for seats"


def _store(tmp_path: Path, name: str, text: bytes) -> DirStore:
    store = DirStore(tmp_path)
    writer = store.create(name)
    writer.write(text)
    writer.commit()
    return store


def test_reading_from_a_cursor_numbers_lines_and_skips_blank_ones(tmp_path: Path) -> None:
    store = _store(tmp_path, "in", b'{"a":1}\n\n{"a":2}\n{"a":3}\n\n')
    first = read_from(store, "in", 0, 1, 2)
    assert [(n, t) for n, _, t in first.lines] == [(1, b'{"a":1}\n'), (3, b'{"a":2}\n')]
    assert (first.next_line, first.at_end) == (4, False)
    assert read_at(store, "in", first.lines[1][1]) == b'{"a":2}\n'
    rest = read_from(store, "in", first.next_offset, first.next_line, 2)
    assert [n for n, _, _ in rest.lines] == [4] and rest.at_end
    assert read_from(store, "in", rest.next_offset, rest.next_line, 2).lines == []


def test_validation_counts_requests_and_refuses_repeated_custom_ids(tmp_path: Path) -> None:
    store = _store(tmp_path, "in", b'{"custom_id":"x"}\nnot json\n{"custom_id":"y"}\n{"custom_id":"x"}\n')
    total, errors = validate(store, "in")
    assert total == 4 and [(e["code"], e["line"]) for e in errors] == [("duplicate_custom_id", 4)]
    assert validate(_store(tmp_path, "empty", b"\n\n"), "empty")[1][0]["code"] == "empty_file"


def test_merge_drops_torn_lines_and_keeps_one_line_per_request(tmp_path: Path) -> None:
    rec = BatchRecord("batch_t", "alice", "/v1/completions", "in", 1, 2)
    ok = [lines.ok_line(lines.line_id(rec.id, n), f"c{n}", {"n": n}) for n in (1, 2)]
    bad = lines.error_line(lines.line_id(rec.id, 3), "c3", 400, {"error": {}})
    out = b"".join(json.dumps(r).encode() + b"\n" for r in (ok[0], ok[1], ok[0])) + b'{"id": "torn'
    store = _store(tmp_path, output_part(rec.id), out)
    again = lines.error_line(lines.line_id(rec.id, 2), "c2", 500, {"error": {}})  # answered after all
    _store(
        tmp_path, error_part(rec.id), json.dumps(bad).encode() + b"\n" + json.dumps(again).encode() + b"\n"
    )
    merged = merge(store, rec, None, ("out", "err"))
    assert (merged.output, merged.errors) == (2, 1)
    with store.open("out") as f:
        assert [json.loads(x)["custom_id"] for x in f] == ["c1", "c2"]
    with store.open("err") as f:
        assert [json.loads(x)["custom_id"] for x in f] == ["c3"]


def test_the_record_round_trips_through_its_hash() -> None:
    rec = BatchRecord("batch_r", "bob", "/v1/chat/completions", "file-1", 10, 20, metadata={"k": "v"})
    rec.fed_all, rec.completed, rec.errors = (
        True,
        3,
        [{"code": "x", "message": "m", "param": None, "line": 2}],
    )
    raw = {k.encode(): v.encode() for k, v in rec.to_hash().items()}
    assert BatchRecord.from_hash(raw) == rec
    body = rec.to_openai()
    assert body["object"] == "batch" and body["request_counts"] == {"total": 0, "completed": 3, "failed": 0}
    assert body["errors"]["data"][0]["line"] == 2 and body["in_progress_at"] is None


def test_a_line_is_parsed_as_the_online_endpoint_parses_it() -> None:
    parse = lines.served_parse("tiny")
    body = {"model": "tiny", "prompt": [1, 2], "max_tokens": 2}
    good = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": body}
    assert lines.parse_line(1, json.dumps(good), parse, "/v1/completions").request is not None
    other = lines.parse_line(2, json.dumps(good), parse, "/v1/chat/completions")
    assert other.error_code == "invalid_url" and other.custom_id == "a"
    wrong = lines.parse_line(3, json.dumps({**good, "body": {**body, "model": "big"}}), parse)
    assert (wrong.error_code, wrong.status_code) == ("model_not_found", 404)
    assert lines.parse_line(4, "{", parse).error_code == "invalid_json"


def test_a_running_line_keeps_its_worker() -> None:
    """The runner counts a running line against its worker's seats: the worker must survive Redis."""
    line = Running(12, ["j1", "j2"], 1.5, "w1@test")
    assert Running.from_json(line.to_json()) == line
    assert Running.from_json('{"offset": 1, "jobs": [], "fed_at": 0}').worker is None  # older records
