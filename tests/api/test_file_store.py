"""DirStore: atomic writes (nothing visible before commit, nothing left by abort), part files that
drop a torn last line on open, and names that cannot leave the store's directory."""

from __future__ import annotations

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
