"""Where file contents live, behind one small interface: a directory by default (a named volume
shared by every api replica in docker-compose). Metadata lives in Redis (records.py), never here.

Writes are atomic: a FileWriter fills a temporary file and `commit()` renames it into place, so a
reader never sees half a file and an aborted upload leaves nothing. Part files (the batch runner's
output as lines finish) are appended to with a FileAppender: each append is fsynced, and opening
one drops a torn last line (a crash mid-write), so what remains is whole lines only.

The store holds every tenant's prompts: its directories are 0700 and its files 0600, whatever the
umask (as `serve` keeps its run directory); `secure()` at start-up brings an older store to that.

Every call blocks on the disk: async code runs them with asyncio.to_thread."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

__all__ = ["DirStore", "FileAppender", "FileStore", "FileWriter", "Stored", "check_name", "new_file_id"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
_TMP = ".tmp"
DIR_MODE = 0o700
FILE_MODE = 0o600


def new_file_id() -> str:
    """An id in OpenAI's form ("file-" and hex)."""
    return f"file-{uuid.uuid4().hex}"


def check_name(name: str) -> str:
    """`name` if it is safe as a file name in the store (no separators, no dot-dot), else ValueError."""
    if not _NAME.fullmatch(name) or ".." in name:
        raise ValueError(f"not a valid file name: {name!r}")
    return name


@dataclass(frozen=True, slots=True)
class Stored:
    """One file in the store, as the sweeper (api/files/sweeper.py) sees it."""

    name: str
    mtime: float  # unix time of its last write
    tmp: bool  # a write in progress (or one cut off by a crash), not yet under its name


class FileWriter(Protocol):
    """A new file being written: nothing is visible under its id until commit()."""

    def write(self, data: bytes) -> None: ...

    def commit(self) -> None:
        """Flush, fsync and rename into place (replacing a file of that id)."""

    def abort(self) -> None:
        """Drop what was written; safe after commit() or abort() (then it does nothing)."""


class FileAppender(Protocol):
    """A part file that grows by whole lines, each append durable before it returns."""

    def append(self, line: bytes) -> None:
        """Append one line (a newline is added when it has none) and fsync."""

    def append_lines(self, lines: Iterable[bytes]) -> None:
        """Append several lines with one fsync."""

    def truncate_partial(self) -> int:
        """Drop a trailing line with no newline (a torn write); the bytes dropped. Done on open."""

    def close(self) -> None: ...


class FileStore(Protocol):
    def create(self, file_id: str) -> FileWriter: ...

    def open(self, file_id: str) -> BinaryIO:
        """For reading; FileNotFoundError if there is no such file."""

    def delete(self, file_id: str) -> None:
        """Remove it; nothing if it is absent."""

    def append(self, name: str) -> FileAppender:
        """Open (creating it if needed) a part file; open(name) and delete(name) read and remove it."""

    def path(self, file_id: str) -> Path | None:
        """Its path on the local disk, None if absent (or a store without local paths)."""

    def secure(self) -> None:
        """At start-up: the store readable by this user only (made if need be)."""

    def listing(self) -> list[Stored]:
        """Every file, temporary ones included."""

    def remove(self, entry: Stored) -> None:
        """Remove a file listing() gave; nothing if it is gone."""


class _DirWriter:
    def __init__(self, tmp: Path, final: Path) -> None:
        self._tmp, self._final = tmp, final
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        self._file: BinaryIO | None = os.fdopen(fd, "wb")

    def write(self, data: bytes) -> None:
        if self._file is None:
            raise ValueError("write after commit or abort")
        self._file.write(data)

    def commit(self) -> None:
        if self._file is None:
            raise ValueError("commit after commit or abort")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        os.replace(self._tmp, self._final)
        _fsync_dir(self._final.parent)

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> _DirWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()  # after a commit: nothing


class _DirAppender:
    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, FILE_MODE)
        self._file: BinaryIO = os.fdopen(fd, "a+b")
        self.truncate_partial()

    def truncate_partial(self) -> int:
        size = self._file.seek(0, os.SEEK_END)
        keep = size
        while keep > 0:  # back to just after the last newline, a block at a time
            start = max(0, keep - 65536)
            self._file.seek(start)
            chunk = self._file.read(keep - start)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            keep = start
        if keep < size:
            self._file.truncate(keep)
            os.fsync(self._file.fileno())
        return size - keep

    def append(self, line: bytes) -> None:
        self.append_lines((line,))

    def append_lines(self, lines: Iterable[bytes]) -> None:
        data = b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines)
        if data:
            self._file.write(data)
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> _DirAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DirStore:
    """Files as `root/<id>`; uploads in progress under `root/.tmp/` (same disk, so rename is atomic)."""

    def __init__(self, root: Path) -> None:
        self.root = root  # made on the first write: building the app touches no disk

    @property
    def tmp(self) -> Path:
        """Uploads and merges in progress (one that stays here was cut off by a crash)."""
        return self.root / _TMP

    def secure(self) -> None:
        """Make the store (or bring an existing one to) directories 0700, files 0600."""
        self._dirs()
        for directory in (self.root, self.tmp):
            os.chmod(directory, DIR_MODE)
            for entry in os.scandir(directory):
                if entry.is_file(follow_symlinks=False):
                    os.chmod(entry.path, FILE_MODE)

    def create(self, file_id: str) -> _DirWriter:
        final = self.root / check_name(file_id)
        self._dirs()
        return _DirWriter(self.root / _TMP / f"{file_id}.{uuid.uuid4().hex}", final)

    def open(self, file_id: str) -> BinaryIO:
        return open(self.root / check_name(file_id), "rb")

    def delete(self, file_id: str) -> None:
        (self.root / check_name(file_id)).unlink(missing_ok=True)

    def append(self, name: str) -> _DirAppender:
        path = self.root / check_name(name)
        self._dirs()
        return _DirAppender(path)

    def path(self, file_id: str) -> Path | None:
        found = self.root / check_name(file_id)
        return found if found.is_file() else None

    def listing(self) -> list[Stored]:
        found = []
        for directory, tmp in ((self.root, False), (self.tmp, True)):
            try:
                entries = os.scandir(directory)
            except FileNotFoundError:
                continue
            with entries:
                for entry in entries:
                    if entry.is_file(follow_symlinks=False):
                        found.append(Stored(entry.name, entry.stat().st_mtime, tmp))
        return found

    def remove(self, entry: Stored) -> None:
        ((self.tmp if entry.tmp else self.root) / check_name(entry.name)).unlink(missing_ok=True)

    def _dirs(self) -> None:
        # mkdir's mode applies to the last directory only: parents (~/.cache/kvferry) are the user's
        self.root.mkdir(DIR_MODE, parents=True, exist_ok=True)
        self.tmp.mkdir(DIR_MODE, exist_ok=True)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
