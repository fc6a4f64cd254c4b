"""The engine thread owns the engine: outside workers/engine and workers/loop, no code reaches
into an engine's pool, block manager, scheduler, tiers or tensors. Task threads talk to the
loop through its typed messages and the facts it publishes (EngineLoop.tokenizer, block_size,
fingerprint, held). And one function roots every block chain: kvstore.chain.chain_root."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvstore.pool.events import BlockRemoved, BlockStored
from kvstore.tiers.stored_block import StoredBlock
from kvstore.tiers.warm import WarmTier

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = ["workers/process", "workers/jobs", "workers/sessions", "workers/tiers", "api", "broker"]
ENGINE_PARTS = {"pool", "block_manager", "scheduler", "tiers", "kv_cache", "runner", "sampler", "post"}


def _modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _reaches_in(tree: ast.AST) -> list[str]:
    """`<x>.engine.<part>`, `engine.<part>`, or `<x>.engine` read off a loop (`loop.engine`)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        named_engine = (isinstance(value, ast.Name) and value.id == "engine") or (
            isinstance(value, ast.Attribute) and value.attr == "engine"
        )
        if named_engine and node.attr in ENGINE_PARTS:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        owner = (
            value.id
            if isinstance(value, ast.Name)
            else value.attr
            if isinstance(value, ast.Attribute)
            else ""
        )
        if node.attr == "engine" and "loop" in owner:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", _modules(*OUTSIDE), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_task_thread_reaches_into_the_engine(path: Path) -> None:
    assert not _reaches_in(ast.parse(path.read_text())), _reaches_in(ast.parse(path.read_text()))


def test_the_scan_finds_what_it_forbids() -> None:
    sample = "n = loop.engine.scheduler.blocks.tails\nm = engine.pool.block_size\nt = self.loop.engine\n"
    assert len(_reaches_in(ast.parse(sample))) == 4


def test_one_function_roots_every_chain() -> None:
    """root_hash is called by kvstore/chain.py alone (chain_root, for chain and the engine)."""
    callers = [
        str(p.relative_to(ROOT))
        for p in _modules("workers", "kvstore", "api", "broker", "ops")
        if p.name != "chain.py" and "root_hash" in p.read_text()
    ]
    assert callers == []


def test_blocks_on_their_way_to_the_warm_tier_count_as_held() -> None:
    """A prefetch's blocks wait in the loop's inbox until the step ends: meanwhile a second
    prefetch (the job's own, after a hint's) must not fetch them from Redis again."""
    from workers.engine.tiers.resident import ResidentBlocks

    warm = WarmTier(1 << 20)
    held = ResidentBlocks(warm)
    a, b, c = b"a" * 32, b"b" * 32, b"c" * 32
    held.on_pool_event(BlockStored(a, b"r" * 32, (1,), 0))
    assert held.first_missing([a, b, c]) == 1
    held.expect([b])
    assert held.first_missing([a, b, c]) == 2  # on its way: not fetched twice
    held.arrived([b])
    assert held.first_missing([a, b, c]) == 1  # it never reached the warm tier: missing again
    warm.put(StoredBlock(b, a, (2,), b"x" * 8))
    assert held.first_missing([a, b, c]) == 2
    held.on_pool_event(BlockRemoved(a, 0))
    assert held.first_missing([a, b, c]) == 0
