"""The weights fingerprint covers every byte of the weights: two checkpoints that differ in one
weight of their last layer never share KV blocks (or a converted-model cache)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from workers.engine.model.fingerprint import dir_fingerprint, file_fingerprint
from workers.engine.model.loader import load_model


def _edited_copy(source: Path, target: Path) -> Path:
    """The same model with one weight of its last layer changed (embeddings untouched)."""
    shutil.copytree(source, target)
    weights = target / "model.safetensors"
    tensors = load_file(weights)
    name = next(
        n for n in sorted(tensors) if n.startswith("model.layers.1.") and n.endswith("down_proj.weight")
    )
    tensors[name] = tensors[name].clone()
    tensors[name][-1, -1] += 1.0
    save_file(tensors, weights, metadata={"format": "pt"})
    return target


def test_one_changed_weight_changes_the_fingerprint(tiny_model_dir: Path, tmp_path: Path) -> None:
    base = shutil.copytree(tiny_model_dir, tmp_path / "base")
    edited = _edited_copy(tiny_model_dir, tmp_path / "edited")
    first_mib = (base / "model.safetensors").read_bytes()[: 1 << 20]
    assert first_mib == (edited / "model.safetensors").read_bytes()[: 1 << 20]  # what fooled the old one
    a = load_model(str(base), "float32", "cpu", tmp_path / "cache").fingerprint
    b = load_model(str(edited), "float32", "cpu", tmp_path / "cache").fingerprint
    assert a != b


def test_fingerprint_is_stable_across_processes_and_cached(tiny_model_dir: Path, tmp_path: Path) -> None:
    directory = shutil.copytree(tiny_model_dir, tmp_path / "model")
    here = dir_fingerprint(directory)
    code = (
        "from pathlib import Path; from workers.engine.model.fingerprint import dir_fingerprint; "
        f"print(dir_fingerprint(Path({str(directory)!r})))"
    )
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert there.stdout.strip() == here
    sidecar = directory / ("model.safetensors" + ".kvferry-fingerprint.json")
    assert sidecar.exists()


def test_a_changed_file_is_hashed_again(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"w": torch.zeros(4)}, path)
    before = file_fingerprint(path)
    save_file({"w": torch.ones(4)}, path)  # same size, new content and mtime
    assert file_fingerprint(path) != before


def test_unwritable_sidecar_caches_under_the_cache_dir(tmp_path: Path) -> None:
    path = tmp_path / "model" / "w.bin"
    path.parent.mkdir()
    path.write_bytes(b"x" * 100)
    # Root can write anywhere, so block the sidecar's name with a folder instead of chmod.
    (path.parent / ("w.bin" + ".kvferry-fingerprint.json")).mkdir()
    digest = file_fingerprint(path, tmp_path / "cache")
    assert len(list((tmp_path / "cache" / "fingerprints").iterdir())) == 1
    assert file_fingerprint(path, tmp_path / "cache") == digest
