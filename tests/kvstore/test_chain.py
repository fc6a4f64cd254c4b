from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore.chain import hash_block, hash_blocks, root_hash

REPO_ROOT = Path(__file__).resolve().parents[2]

PINNED_ROOT = "c0719e3afeb6d915795b63eb5a879c93c63d3b22543e7f2dc6af1b1ba667cdb9"
PINNED_BLOCK = "2e25ddd1af6cedf423dea0d546d6733966471d22d6672df19938b676cee6b22e"
PINNED_CHAIN = [
    "350776edba8e9266dc3bd90faa13e12bd9a812ae4129701965b7c7bc3b9b6773",
    "3cdc0b2e0ead391a3bb3ddc95d53b8a1a4f39c2265dacf9724268c4aa24ca01b",
]


def test_pinned_values() -> None:
    root = root_hash(["smollm2-135m", "tenant-a"])
    assert root.hex() == PINNED_ROOT
    assert hash_block(root, [1, 2, 3, 4]).hex() == PINNED_BLOCK
    assert [h.hex() for h in hash_blocks(list(range(10)), 4, ["m", 7, b"\x00"])] == PINNED_CHAIN


def test_hash_block_is_sha256_of_parent_and_int64_le_tokens() -> None:
    parent = bytes(range(32))
    tokens = [0, 1, -1, 2**40, 151_000]
    expected = hashlib.sha256(parent + struct.pack("<5q", *tokens)).digest()
    assert hash_block(parent, tokens) == expected
    assert len(expected) == 32


def test_root_depends_on_extra_keys_and_their_boundaries() -> None:
    base = root_hash(["model", "tenant-a"])
    assert root_hash(["model", "tenant-a"]) == base
    assert root_hash(["model", "tenant-b"]) != base
    assert root_hash(["model"]) != base
    assert root_hash([]) != root_hash([""])
    assert root_hash(["ab", "c"]) != root_hash(["a", "bc"])
    assert root_hash([1]) != root_hash(["1"]) != root_hash([b"1"])


def test_extra_key_of_unsupported_type_raises() -> None:
    with pytest.raises(TypeError):
        root_hash([1.5])  # type: ignore[list-item]


def test_chain_depends_on_salt_and_parent() -> None:
    tokens = list(range(8))
    a = hash_blocks(tokens, 4, ["m", "tenant-a"])
    b = hash_blocks(tokens, 4, ["m", "tenant-b"])
    assert a[0] != b[0] and a[1] != b[1]
    assert hash_block(a[0], tokens[4:]) != hash_block(b[0], tokens[4:])
    assert hash_block(a[0], [9, 9, 9, 9]) != hash_block(a[1], [9, 9, 9, 9])


def test_hash_blocks_full_blocks_only_and_chaining() -> None:
    keys = ["m"]
    assert hash_blocks([1, 2, 3], 4, keys) == []
    hashes = hash_blocks(list(range(11)), 4, keys)
    assert len(hashes) == 2
    root = root_hash(keys)
    assert hashes[0] == hash_block(root, [0, 1, 2, 3])
    assert hashes[1] == hash_block(hashes[0], [4, 5, 6, 7])
    # Continuing from a parent equals hashing the whole sequence at once.
    continued = hash_blocks(list(range(4, 12)), 4, keys, parent=hashes[0])
    assert continued == hash_blocks(list(range(12)), 4, keys)[1:]


def test_bad_block_size_raises() -> None:
    with pytest.raises(ValueError):
        hash_blocks([1, 2], 0, ["m"])


@pytest.mark.parametrize("hash_seed", ["0", "12345"])
def test_identical_in_a_fresh_process(hash_seed: str) -> None:
    code = (
        "from kvstore.chain import hash_blocks\n"
        "print(','.join(h.hex() for h in hash_blocks(list(range(10)), 4, ['m', 7, b'\\x00'])))"
    )
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().split(",") == PINNED_CHAIN
