"""kvferry's CPU kernels (csrc/*.cpp: paged decode attention, the decode-step GEMM, the decoder stack
of a decode-only step in one call, the streaming block loader), built once per machine on first use.

They are built with torch's own extension builder (`torch.utils.cpp_extension.load`, g++ and
ninja) into one library in torch's extension cache (~/.cache/torch_extensions, or
$TORCH_EXTENSIONS_DIR), named by a hash of the sources, the flags, torch's version and this CPU's
instruction set; the first build compiles them, later processes load the built library. Where it
cannot be built (no compiler), each user keeps its torch path: decode_kernel.py's callers gather +
SDPA, packed_linear.py packs for oneDNN, KVCache.write_blocks copies with numpy.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from pathlib import Path

import torch

log = logging.getLogger(__name__)
SOURCES = tuple(sorted((Path(__file__).with_name("csrc")).glob("*.cpp")))
HEADERS = tuple(sorted((Path(__file__).with_name("csrc")).glob("*.h")))  # in the build key, not compiled
_CFLAGS = ["-O3", "-march=native", "-fopenmp"]
_BUILD_LOCK_TIMEOUT_S = 600  # a hung compiler ends in the torch paths, not in a worker that never starts
_OPS = ("paged_decode", "skinny_linear", "skinny_bf16_linear", "decoder_layers", "write_blocks")
_lock = threading.Lock()
_built: bool | None = None


def built() -> bool:
    """True once every op of the library is loaded (built here first if need be)."""
    global _built
    with _lock:
        if _built is None:
            _built = _build()
        return _built


def _build_key() -> str:
    """Everything the built library depends on: its sources, the flags, torch, and the CPU's
    instruction set (-march=native). ninja alone decides by file times, which a copied or rolled
    back source (an image over a shared cache volume) does not move. And the sources' directory:
    torch's build.ninja names them by path, so two checkouts sharing one build would rebuild it in
    turn, each under the lock, while the other's workers wait to start."""
    try:
        cpu = next(
            (
                line
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith(("flags", "Features"))  # x86, aarch64
            ),
            "",
        )
    except OSError:
        cpu = ""
    digest = hashlib.sha256(str(SOURCES[0].parent if SOURCES else "").encode())
    for source in SOURCES + HEADERS:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    digest.update(f"{_CFLAGS} {torch.__version__} {cpu}".encode())
    return digest.hexdigest()[:12]


def _loaded() -> bool:
    return all(hasattr(torch.ops.kvferry, op) for op in _OPS)


def _build() -> bool:
    if _loaded():
        return True
    try:
        _load()
    except Exception as err:  # no compiler, no ninja, a failed build: the torch paths stay
        log.warning("kvferry's CPU kernels did not build (%s); the torch paths stay", err)
        return False
    return _loaded()


def _load() -> None:
    from filelock import FileLock
    from torch.utils.cpp_extension import _get_build_directory, load

    if shutil.which("ninja") is None:  # the pip `ninja` wheel puts its binary beside python
        import ninja

        os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"
    name = library_name()
    build_dir = Path(_get_build_directory(name, verbose=False))  # where load() itself would build
    # torch serialises builds with a lock file that outlives a builder killed mid-build (a worker
    # stopped by its supervisor), and then every later load waits on it forever. This flock dies
    # with its process: whoever holds it is the only builder, so a torch lock file is stale.
    with FileLock(str(build_dir) + ".lock", timeout=_BUILD_LOCK_TIMEOUT_S):
        for attempt in (1, 2):
            (build_dir / "lock").unlink(missing_ok=True)
            try:
                load(
                    name=name,
                    sources=[str(s) for s in SOURCES],
                    extra_cflags=_CFLAGS,
                    extra_ldflags=["-fopenmp"],
                    build_directory=str(build_dir),
                    is_python_module=False,
                    verbose=False,
                )
                return
            except Exception:
                if attempt == 2:
                    raise
                shutil.rmtree(build_dir, ignore_errors=True)  # a half-written library: build afresh
                build_dir.mkdir(parents=True, exist_ok=True)


def library_name() -> str:
    return f"kvferry_cpu_kernels_{_build_key()}"
