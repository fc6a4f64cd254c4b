"""omp_team finds the OpenMP runtime torch's ops (and kvferry's kernels) run on, as the dynamic
linker bound it for them, even beside a second libgomp in the process: a confined thread's torch
ops then run on a team of one. In a child process, whose libraries the test chooses."""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import ctypes, json, os, sys, threading
import torch
from workers.engine.kernels import build
from workers.engine.kernels import omp_team

def gomps():
    return {os.path.realpath(l.split()[-1]) for l in open("/proc/self/maps") if "libgomp" in l}

torch.ones(4).sum()
torch_gomp = gomps()
ctypes.CDLL(sys.argv[1])  # a second libgomp, loaded by path (a library of another project would)
assert len(gomps()) == len(torch_gomp) + 1, gomps()
kernels = build.built()
seen = []

def confined():
    omp_team.confine_to_this_thread()
    torch.ones(1 << 20).sum()
    seen.append(torch.get_num_threads())

thread = threading.Thread(target=confined)
thread.start()
thread.join(60)
got = {"torch": sorted(torch_gomp), "kernels": kernels, "seen": seen, "main": torch.get_num_threads()}
print(json.dumps(got))
setters = omp_team._team_size_setters(omp_team._omp_users())
got |= {"set": sorted(omp_team.runtime_path(f) for f in setters), "users": omp_team._omp_users()}
print(json.dumps(got))
"""


def _other_libgomp() -> str | None:
    """A libgomp file other than torch's (the system's, where gcc is installed)."""
    import torch

    name = ctypes.util.find_library("gomp")
    torch_lib = Path(torch.__file__).parent / "lib"
    for candidate in (name, f"/usr/lib/x86_64-linux-gnu/{name}", f"/lib/x86_64-linux-gnu/{name}"):
        if candidate and os.path.isabs(candidate) and os.path.exists(candidate):
            path = os.path.realpath(candidate)
            if Path(path).parent != torch_lib.resolve():
                return path
    return None


def test_a_confined_thread_sets_the_runtime_torch_links_not_another_libgomp() -> None:
    other = _other_libgomp()
    if other is None:
        pytest.skip("no second libgomp on this machine")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "3"}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, other],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = out.stdout.strip().splitlines()
    assert lines, out.stderr[-3000:]
    got = json.loads(lines[0])
    if not got["torch"]:
        pytest.skip("torch runs no libgomp here")
    assert got["seen"] == [1], "the confined thread's torch ops run on a team of one"
    assert got["main"] > 1, "the other threads keep theirs"
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(lines[1])
    assert got["set"] == got["torch"], "the team size goes to the libgomp torch links, the other left alone"
    assert other not in got["set"]
    assert any("libtorch_cpu" in u for u in got["users"])
    assert not got["kernels"] or len(got["users"]) == 2, "kvferry's kernel library is looked at too"
