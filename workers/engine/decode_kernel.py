"""The CPU decode-attention kernel (csrc/paged_decode.cpp), built once per machine on first use.

On CPU a decode step's attention was two memory-bound passes: `index_select` copying every
context out of the pool, then SDPA over the copy, whose flash kernel does little with one query
row. `kvferry::paged_decode` reads each context where it lies, through its block table: measured
on 16 contexts x 30 layers of SmolLM2's shape, 52 -> 16 ms at 160 tokens and 200 -> 65 ms at 592.
vLLM's CPU backend and llama.cpp both attend over their caches in place the same way.

It is built with torch's own extension builder (`torch.utils.cpp_extension.load`, g++ and ninja)
into torch's extension cache (~/.cache/torch_extensions, or $TORCH_EXTENSIONS_DIR), named by a
hash of the source, the flags, torch's version and this CPU's instruction set; the first build
takes ~15 s, later processes load the built library. Where it cannot be built (no compiler), or
a probe of it disagrees with SDPA, decodes keep the index_select + SDPA path, which CUDA and other
dtypes always use.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from pathlib import Path

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("csrc") / "paged_decode.cpp"
HEAD_DIMS = (16, 32, 64, 128, 256)  # the head sizes the kernel is instantiated for
_lock = threading.Lock()
_built: bool | None = None


def available() -> bool:
    """True once `torch.ops.kvferry.paged_decode` is loaded and agrees with SDPA."""
    global _built
    with _lock:
        if _built is None:
            _built = _build() and _probe()
        return _built


def _probe() -> bool:
    try:
        return _agrees()
    except Exception as err:  # e.g. a library of another signature: the torch path stays
        log.warning("the CPU decode-attention kernel failed its probe (%s); decodes gather + SDPA", err)
        return False


def paged_decode(
    out: torch.Tensor,
    query: torch.Tensor,
    pool: torch.Tensor,
    blocks: torch.Tensor,
    lens: torch.Tensor,
    block_size: int,
    scale: float,
) -> None:
    """out[i] = attention of query[i] ([Hq, D]) over the first lens[i] slots of blocks[i] in pool
    ([2, slots, Hkv, D], K then V). The kernel checks shapes, dtypes and every block id."""
    torch.ops.kvferry.paged_decode(out, query, pool, blocks, lens, block_size, scale)


_CFLAGS = ["-O3", "-march=native", "-fopenmp"]
_BUILD_LOCK_TIMEOUT_S = 600  # a hung compiler ends in the torch path, not in a worker that never starts


def _build_key() -> str:
    """Everything the built library depends on: its source, the flags, torch, and the CPU's
    instruction set (-march=native). ninja alone decides by file times, which a copied or rolled
    back source (an image over a shared cache volume) does not move."""
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
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(f"{_CFLAGS} {torch.__version__} {cpu}".encode())
    return digest.hexdigest()[:12]


def _build() -> bool:
    if hasattr(torch.ops.kvferry, "paged_decode"):
        return True
    try:
        _load()
    except Exception as err:  # no compiler, no ninja, a failed build: the torch path stays
        log.warning("the CPU decode-attention kernel did not build (%s); decodes gather + SDPA", err)
        return False
    return hasattr(torch.ops.kvferry, "paged_decode")


def _load() -> None:
    from filelock import FileLock
    from torch.utils.cpp_extension import _get_build_directory, load

    if shutil.which("ninja") is None:  # the pip `ninja` wheel puts its binary beside python
        import ninja

        os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"
    name = f"kvferry_paged_decode_{_build_key()}"
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
                    sources=[str(SOURCE)],
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


def _agrees() -> bool:
    """One random probe against SDPA over a gathered copy, ragged lengths and GQA included."""
    gen = torch.Generator().manual_seed(0)
    bs, nblocks, hkv, groups, d, n = 4, 12, 2, 3, 64, 3
    pool = torch.randn(2, nblocks * bs, hkv, d, generator=gen)
    blocks = torch.randperm(nblocks, generator=gen)[: n * 3].view(n, 3)
    lens = torch.tensor([12, 5, 9])
    query = torch.randn(n, hkv * groups, d, generator=gen)
    out = torch.empty_like(query)
    paged_decode(out, query, pool, blocks, lens, bs, d**-0.5)
    for i in range(n):
        slots = (blocks[i, :, None] * bs + torch.arange(bs)).flatten()[: int(lens[i])]
        k, v = pool[0, slots].transpose(0, 1), pool[1, slots].transpose(0, 1)  # [Hkv, L, D]
        q = query[i].view(hkv, groups, d)
        want = F.scaled_dot_product_attention(q, k, v, scale=d**-0.5).reshape(hkv * groups, d)
        if not torch.allclose(out[i], want, rtol=1e-4, atol=1e-5):
            log.warning("the CPU decode-attention kernel disagrees with SDPA; decodes gather + SDPA")
            return False
    return True
