"""Weights fingerprints: a digest of a weights file's whole content. It roots every KV block hash
and names the converted-GGUF cache, so two checkpoints that differ in any byte never share blocks.

Hashing a file of a few GB takes seconds, so each digest is remembered in a small sidecar file next
to the weights (or under the cache dir when that folder is read-only), keyed by the file's resolved
path, size and mtime: a changed file is hashed again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

_SIDECAR_SUFFIX = ".kvferry-fingerprint.json"
_DIGEST_CHARS = 32  # 128 bits of sha256


def _stamp(path: Path) -> dict[str, int | str]:
    st = path.stat()
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _sidecars(path: Path, cache_dir: Path | None) -> list[Path]:
    places = [path.with_name(path.name + _SIDECAR_SUFFIX)]
    if cache_dir is not None:
        tag = hashlib.sha256(str(path).encode()).hexdigest()[:16]
        places.append(cache_dir / "fingerprints" / f"{path.name}-{tag}.json")
    return places


def _read(sidecar: Path, stamp: dict[str, int | str]) -> str | None:
    try:
        saved = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or saved.get("stamp") != stamp:
        return None
    digest = saved.get("sha256")
    return digest if isinstance(digest, str) and len(digest) == _DIGEST_CHARS else None


def _write(sidecar: Path, stamp: dict[str, int | str], digest: str) -> bool:
    try:
        sidecar.parent.mkdir(parents=True, exist_ok=True)
        tmp = sidecar.with_name(f".{sidecar.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"stamp": stamp, "sha256": digest}))
        os.replace(tmp, sidecar)  # atomic: concurrent workers write the same content
        return True
    except OSError:
        return False


def file_fingerprint(path: Path, cache_dir: Path | None = None) -> str:
    """sha256 of the file's whole content (hex, 128 bits), hashed once per (path, size, mtime)."""
    path = path.resolve()
    stamp = _stamp(path)
    places = _sidecars(path, cache_dir)
    for sidecar in places:
        known = _read(sidecar, stamp)
        if known is not None:
            return known
    with path.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()[:_DIGEST_CHARS]
    for sidecar in places:
        if _write(sidecar, stamp, digest):
            break
    return digest


def dir_fingerprint(directory: Path, cache_dir: Path | None = None) -> str:
    """A model directory: its config and the full content of every weights file."""
    h = hashlib.sha256((directory / "config.json").read_bytes())
    for weights in sorted(directory.glob("*.safetensors")) + sorted(directory.glob("*.bin")):
        h.update(weights.name.encode() + b"\0" + file_fingerprint(weights, cache_dir).encode())
    return h.hexdigest()[:_DIGEST_CHARS]
