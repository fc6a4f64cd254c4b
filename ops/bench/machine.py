"""Which machine a figure came from: every bench names its CPU in its JSON."""

from __future__ import annotations

import platform
import subprocess


def cpu_model() -> str:
    """`lscpu`'s model name; where lscpu is missing or says nothing, platform.processor()."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name" and value.strip():
            return value.strip()
    return platform.processor() or "unknown"
