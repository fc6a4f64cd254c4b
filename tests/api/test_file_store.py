"""DirStore: atomic writes (nothing visible before commit, nothing left by abort), part files that
drop a torn last line on open, and names that cannot leave the store's directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from api.files.store import DirStore, new_file_id


def test_write_is_invisible_until_commit(tmp_path: Path) -> None:
    store = DirStore(tmp_path)
    file_id = new_file_id()
    writer = store.create(file_id)
    writer.write(b'{"a": 1}\n')
    assert store.path(file_id) is None
    with pytest.raises(FileNotFoundError):
        store.open(file_id)
    writer.write(b'{"b": 2}\n')
    writer.commit()
    with store.open(file_id) as f:
        assert f.read() == b'{"a": 1}\n{"b": 2}\n'
    assert store.path(file_id) == tmp_path / file_id
    store.delete(file_id)
    store.delete(file_id)  # absent: nothing
    assert store.path(file_id) is None


def test_abort_leaves_nothing(tmp_path: Path) -> None:
    store = DirStore(tmp_path)
    writer = store.create("file-x")
    writer.write(b"partial")
    writer.abort()
    writer.abort()
    assert store.path("file-x") is None
    assert list((tmp_path / ".tmp").iterdir()) == []


def test_appender_drops_a_torn_line_on_open(tmp_path: Path) -> None:
    store = DirStore(tmp_path)
    with store.append("batch_1.part") as part:
        part.append(b'{"custom_id": "a"}')
        part.append_lines([b'{"custom_id": "b"}\n', b'{"custom_id": "c"}'])
    with open(tmp_path / "batch_1.part", "ab") as f:  # a crash mid-append
        f.write(b'{"custom_id": "d", "resp')
    with store.append("batch_1.part") as part:
        part.append(b'{"custom_id": "d"}')
        assert part.truncate_partial() == 0
    with store.open("batch_1.part") as f:
        assert f.read().splitlines() == [
            b'{"custom_id": "a"}',
            b'{"custom_id": "b"}',
            b'{"custom_id": "c"}',
            b'{"custom_id": "d"}',
        ]


def test_appender_drops_a_file_of_one_torn_line(tmp_path: Path) -> None:
    (tmp_path / "p").write_bytes(b"x" * 70000)
    with DirStore(tmp_path).append("p") as part:
        pass
    assert (tmp_path / "p").read_bytes() == b""
    assert part is not None


@pytest.mark.parametrize("name", ["../etc", "a/b", ".tmp", "", "x..y", "/abs"])
def test_unsafe_names_are_refused(tmp_path: Path, name: str) -> None:
    store = DirStore(tmp_path)
    with pytest.raises(ValueError, match="not a valid file name"):
        store.open(name)
    with pytest.raises(ValueError):
        store.create(name)


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_the_store_is_private_whatever_the_umask(tmp_path: Path) -> None:
    """Every tenant's prompts: directories 0700, files 0600 (uploads, merges and part files)."""
    old = os.umask(0o022)
    try:
        store = DirStore(tmp_path / "files")
        writer = store.create("file-a")
        writer.write(b"x\n")
        assert _mode(next((tmp_path / "files" / ".tmp").iterdir())) == 0o600
        writer.commit()
        with store.append("batch_1.output.part") as part:
            part.append(b"{}")
    finally:
        os.umask(old)
    root = tmp_path / "files"
    assert (_mode(root), _mode(root / ".tmp")) == (0o700, 0o700)
    assert (_mode(root / "file-a"), _mode(root / "batch_1.output.part")) == (0o600, 0o600)


def test_secure_makes_an_existing_store_private(tmp_path: Path) -> None:
    """A store made before (0755 directories, 0644 files) is brought to 0700/0600 at start-up."""
    root = tmp_path / "files"
    (root / ".tmp").mkdir(parents=True)
    for directory in (root, root / ".tmp"):
        directory.chmod(0o755)
    (root / "file-old").write_bytes(b"prompt")
    (root / ".tmp" / "file-cut.1").write_bytes(b"half")
    for f in (root / "file-old", root / ".tmp" / "file-cut.1"):
        f.chmod(0o644)
    DirStore(root).secure()
    assert (_mode(root), _mode(root / ".tmp")) == (0o700, 0o700)
    assert (_mode(root / "file-old"), _mode(root / ".tmp" / "file-cut.1")) == (0o600, 0o600)


def test_listing_and_remove(tmp_path: Path) -> None:
    store = DirStore(tmp_path)
    with store.create("file-a") as writer:
        writer.write(b"a")
        writer.commit()
    left = store.create("file-b")  # a write in progress
    left.write(b"b")
    found = {(e.name.split(".")[0], e.tmp) for e in store.listing()}
    assert found == {("file-a", False), ("file-b", True)}
    for entry in store.listing():
        store.remove(entry)
        store.remove(entry)  # gone: nothing
    assert store.listing() == []
    left.abort()
