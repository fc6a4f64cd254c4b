"""`kvferry bench sessions` against a real stack (1 worker, the tiny model, its own Redis): 2
sessions x 2 turns through the command; the JSON's keys, the CSV and PNG, and kvferry's cached
tokens on turn 2 (the session's history hit). Also the command's mode checks and move figures."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ops.bench.sessions.client import Turn
from ops.bench.sessions.driver import Result
from ops.bench.sessions.move import move_figures
from ops.bench.sessions.run import LevelRun
from ops.cli.main import main
from ops.redis.server import free_port
from ops.settings import Settings
from ops.stack.stack import Stack

KEYS = {"server", "model", "sessions", "turns", "per_turn", "ttft_p95_s", "tpot_p95_s", "ttft_p50_s",
        "tpot_p50_s", "stopped_short", "errors", "ttft_p95_turn8_vs_turn1",
        "ttft_p95_last_vs_turn1"}  # fmt: skip


@pytest.fixture(scope="module")
def stack_url(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    settings = Settings(
        model=str(tiny_model_dir), served_model_name="tiny", cache_dir=tmp_path_factory.mktemp("cache"),
        api_port=free_port(), torch_threads=1,
    )  # fmt: skip
    with Stack(settings, 1, run_dir=tmp_path_factory.mktemp("run"), with_flower=False) as stack:
        stack.wait_ready()
        yield stack.api_url


def test_two_sessions_two_turns_against_kvferry(stack_url: str, tmp_path: Path) -> None:
    out, table, png = tmp_path / "s.json", tmp_path / "s.csv", tmp_path / "s.png"
    args = ["bench", "sessions", "--base-url", f"{stack_url}/v1", "--sessions", "2", "--turns", "2",
            "--output-tokens", "4", "--think-mean-s", "0.1", "--system-prompts", "1",
            "--json", str(out), "--csv", str(table), "--png", str(png)]  # fmt: skip
    run = CliRunner().invoke(main, args)
    assert run.exit_code == 0, run.output
    doc = json.loads(out.read_text())
    assert not KEYS - doc.keys()
    assert (doc["server"], doc["model"], doc["sessions"], doc["turns"]) == ("kvferry", "tiny", 2, 2)
    assert doc["errors"] == 0 and doc["stopped_short"] == 0 and doc["ignore_eos"] is True
    turn1, turn2 = doc["per_turn"]
    assert (turn1["turn"], turn2["turn"]) == ("turn1", "turn2")
    assert turn1["requests"] == turn2["requests"] == 2
    assert turn2["prompt_tokens_mean"] > turn1["prompt_tokens_mean"]
    assert turn2["cached_tokens_mean"] > 0  # turn 2 resends turn 1's history: kvferry hits it
    assert doc["ttft_p95_turn8_vs_turn1"] is None and doc["ttft_p95_last_vs_turn1"] > 0
    rows = list(csv.DictReader(table.open()))
    assert len(rows) == 4 and {r["turn"] for r in rows} == {"1", "2"}
    assert png.stat().st_size > 0


def test_find_capacity_stops_at_max_sessions(stack_url: str, tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    args = ["bench", "sessions", "--base-url", stack_url, "--find-capacity", "--max-sessions", "2",
            "--turns", "1", "--output-tokens", "2", "--think-mean-s", "0", "--system-prompts", "1",
            "--slo-ttft", "60", "--slo-tpot", "60", "--json", str(out)]  # fmt: skip
    run = CliRunner().invoke(main, args)
    assert run.exit_code == 0, run.output
    doc = json.loads(out.read_text())
    assert [c["sessions"] for c in doc["capacity"]] == [1, 2]
    assert all(c["met"] for c in doc["capacity"]) and doc["sessions_at_slo"] == 2


def test_a_level_stops_once_its_slo_is_lost(stack_url: str, tmp_path: Path) -> None:
    out, table = tmp_path / "m.json", tmp_path / "m.csv"
    args = ["bench", "sessions", "--base-url", stack_url, "--find-capacity", "--turns", "3",
            "--output-tokens", "2", "--think-mean-s", "0", "--system-prompts", "1",
            "--slo-ttft", "0.000001", "--json", str(out), "--csv", str(table)]  # fmt: skip
    run = CliRunner().invoke(main, args)
    assert run.exit_code == 0, run.output
    doc = json.loads(out.read_text())
    assert doc["sessions_at_slo"] == 0
    (level,) = doc["capacity"]
    assert level["sessions"] == 1 and level["met"] is False and level["missed_early"] is True
    assert len(list(csv.DictReader(table.open()))) == 2  # 2 of 3 TTFTs past the SLO: turn 3 never sent


@pytest.mark.parametrize("extra", [[], ["--base-url", "http://127.0.0.1:1", "--workers", "2"]])
def test_the_command_wants_exactly_one_of_base_url_and_workers(extra: list[str]) -> None:
    run = CliRunner().invoke(main, ["bench", "sessions", *extra])
    assert run.exit_code == 2 and "--base-url" in run.output


def _turn(ttft: float, worker: str) -> Turn:
    return Turn(ttft, 0.01, ttft, 100, 0, 4, "x", worker, "")


def test_move_figures_are_medians_over_sessions() -> None:
    run = LevelRun()
    for i, (before, after, again) in enumerate([(1.0, 1.1, 4.0), (2.0, 2.0, 10.0), (1.0, 3.0, 5.0)]):
        run.turns[(f"s{i}", 2)] = _turn(before, "w1")
        run.turns[(f"s{i}", 3)] = _turn(after, "w2" if i < 2 else "w1")
        run.recomputes[f"s{i}"] = _turn(again, "w2")
    figures = move_figures(Result({}, [], [], [run]), 2)
    assert figures["moved_turn_ttft_ratio"] == pytest.approx(1.1)
    assert figures["moved_vs_recompute"] == pytest.approx(0.275)
    assert figures["moved_sessions"] == 2 and figures["move_pairs"] == 3
    assert not math.isnan(float(figures["recompute_ttft_p50_s"]))  # type: ignore[arg-type]
