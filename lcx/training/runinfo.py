"""What reproduces a run: versions, git commit, XLA flags, devices, resolved config."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    """The lcx source tree's git commit (``+dirty`` if it has uncommitted changes), or None."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(
            ["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def run_info(devices) -> dict:
    import lcx

    return {
        "lcx": lcx.__version__,
        "git_commit": git_commit(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": {p: _version(p) for p in ("jax", "jaxlib", "equinox", "optax", "orbax-checkpoint", "hydra-core")},
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "jax_platforms": os.environ.get("JAX_PLATFORMS", ""),
        "device_kind": devices[0].device_kind if devices else None,
        "device_count": len(devices),
        "process_count": _process_count(),
    }


def _process_count() -> int:
    import jax

    return jax.process_count()
