"""kvferry's CPU kernel library: it builds where there is a compiler, a killed builder does not
hang the next load, the build is named by its sources; and the decode-step GEMM against F.linear,
with its refusals."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.cpp_extension import _get_build_directory

from workers.engine.kernels import build

needs_kernels = pytest.mark.skipif(not build.built(), reason="the CPU kernels did not build here")


def test_the_kernels_build_wherever_there_is_a_compiler() -> None:
    """The fallbacks are for machines without g++, not a place for a broken build to hide."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler on this machine")
    assert build.built()


@needs_kernels
def test_a_builder_killed_mid_build_leaves_no_lock_that_hangs_the_next_load(tmp_path: Path) -> None:
    """torch's build lock file outlives a process killed while building; the next worker must
    still load the kernels (here: the built library copied to a fresh root, beside a stale lock)."""
    built = Path(_get_build_directory(build.library_name(), verbose=False))
    shutil.copytree(built, tmp_path / built.name)
    (tmp_path / built.name / "lock").touch()  # what a SIGKILLed builder leaves behind
    code = "from workers.engine.kernels import build; assert build.built()"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    assert not (tmp_path / built.name / "lock").exists()


def test_the_build_is_named_by_its_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A source that differs (a rollback over a shared cache volume keeps older file times, which
    ninja alone would take as up to date) gets a library of its own name."""
    key = build._build_key()
    edited = tmp_path / build.SOURCES[-1].name
    edited.write_bytes(build.SOURCES[-1].read_bytes() + b"\n// edited\n")
    monkeypatch.setattr(build, "SOURCES", (*build.SOURCES[:-1], edited))
    assert build._build_key() != key


@needs_kernels
@pytest.mark.parametrize("rows", [1, 7, 8, 9, 16, 17, 40, 130])
@pytest.mark.parametrize(("out", "bias"), [(96, False), (101, True), (5, True), (1, False)])
@pytest.mark.parametrize("features", [72, 37, 1])
def test_skinny_linear_matches_f_linear(rows: int, out: int, bias: bool, features: int) -> None:
    """Partial and full 16-row chunks, feature counts off the 6-wide panels (a tail panel alone
    too), odd input widths, with and without a bias."""
    gen = torch.Generator().manual_seed(rows * 1000 + out + features)
    x = torch.randn(rows, features, generator=gen)
    weight = torch.randn(out, features, generator=gen)
    b = torch.randn(out, generator=gen) if bias else None

    got = torch.ops.kvferry.skinny_linear(x, weight, b)

    torch.testing.assert_close(got, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)


@needs_kernels
def test_skinny_linear_of_no_rows_features_or_outputs() -> None:
    assert torch.ops.kvferry.skinny_linear(torch.empty(0, 8), torch.randn(6, 8), None).shape == (0, 6)
    assert torch.ops.kvferry.skinny_linear(torch.randn(3, 8), torch.empty(0, 8), None).shape == (3, 0)
    bias = torch.randn(7)
    got = torch.ops.kvferry.skinny_linear(torch.empty(3, 0), torch.empty(7, 0), bias)
    torch.testing.assert_close(got, bias.expand(3, 7))


@needs_kernels
@pytest.mark.parametrize(
    ("x", "weight", "bias", "match"),
    [
        (torch.randn(2, 8), torch.randn(6, 9), None, "x has 8 features, weight 9"),
        (torch.randn(2, 8).half(), torch.randn(6, 8).half(), None, "fp32 only"),
        (torch.randn(8, 2).t(), torch.randn(6, 8), None, "contiguous CPU"),
        (torch.randn(2, 8), torch.randn(8, 6).t(), None, "contiguous CPU"),
        (torch.randn(2, 8), torch.randn(6, 8), torch.randn(5), "bias must be"),
    ],
)
def test_skinny_linear_refuses_what_it_would_misread(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, match: str
) -> None:
    with pytest.raises(RuntimeError, match=match):
        torch.ops.kvferry.skinny_linear(x, weight, bias)


def test_each_checkout_builds_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same sources in another directory (a second checkout, a worktree) get a library of
    their own name: torch's build.ninja names its sources by path, so one shared build directory
    would be rebuilt by each checkout in turn while the other's workers wait on the build lock."""
    key = build._build_key()
    copies = []
    for source in build.SOURCES:
        (tmp_path / source.name).write_bytes(source.read_bytes())
        copies.append(tmp_path / source.name)
    monkeypatch.setattr(build, "SOURCES", tuple(copies))
    assert build._build_key() != key
