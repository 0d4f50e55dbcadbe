"""What reproduces a run: versions, git commit, XLA flags, devices, the command and its overrides.

:func:`run_info` is written to ``run_info.json`` in every run directory by the training loop (which
adds the resolved config, the plan, the mesh and the hardware peak). Together with Hydra's own
``.hydra/config.yaml`` and ``.hydra/overrides.yaml`` it is enough to rerun the job: check out
``git_commit`` (if ``git_dirty`` lists files, the run used uncommitted changes to them), install
the ``packages`` versions, export ``environment``, and run ``command``.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from typing import Any, cast


@functools.cache
def packages() -> tuple[str, ...]:
    """The distributions lcx requires (its installed metadata, extras left out): the versions
    ``run_info.json`` records. Empty where lcx is not installed."""
    try:
        reqs = metadata.requires("lcx") or []
    except metadata.PackageNotFoundError:  # pragma: no cover - lcx runs installed
        return ()
    return tuple(re.split(r"[\s;<>=!~\[]", r, maxsplit=1)[0] for r in reqs if "extra ==" not in r)


# Environment variables that change what XLA/JAX compute or how many devices exist.
ENV_VARS = (
    "XLA_FLAGS",
    "LIBTPU_INIT_ARGS",
    "JAX_PLATFORMS",
    "JAX_ENABLE_X64",
    "JAX_DEFAULT_MATMUL_PRECISION",
    "TPU_ACCELERATOR_TYPE",
    "CUDA_VISIBLE_DEVICES",
)
# jax.config options that change numerics or the device count.
JAX_OPTIONS = (
    "jax_num_cpu_devices",
    "jax_enable_x64",
    "jax_default_matmul_precision",
    "jax_numpy_dtype_promotion",
    "jax_platforms",
)


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def _git(here: str, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", here, *args], capture_output=True, text=True, timeout=5, check=True
    ).stdout.strip()


@functools.cache
def git_state() -> dict:
    """The lcx source tree's git state: ``commit`` (``+dirty`` appended if tracked files differ),
    ``dirty`` (paths of modified tracked files) and ``branch``; all None outside a git checkout.

    Read ONCE per process, at the first call (the first run's start, after lcx is imported): a
    process keeps running the code it imported, so every later run of the same process (the
    stages of ``lcx.extend``, the jobs of a Hydra multirun) records that state, not whatever the
    checkout holds by the time it starts."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = _git(here, "rev-parse", "HEAD")
        dirty = [p for p in _git(here, "diff", "--name-only", "HEAD").splitlines() if p]
        branch = _git(here, "rev-parse", "--abbrev-ref", "HEAD")
        return {"commit": sha + ("+dirty" if dirty else ""), "dirty": dirty, "branch": branch}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None, "branch": None}


def git_commit() -> str | None:
    """The lcx source tree's git commit (``+dirty`` if it has uncommitted changes), or None."""
    return git_state()["commit"]


def _hydra() -> dict | None:
    """The Hydra job's overrides, run mode and job number, when Hydra runs this process."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return None
        hc = HydraConfig.get()
        # a config node typed as Hydra's schema: .get reads job.num, unset (???) outside a multirun
        job = cast(Any, hc.job)
        return {
            "overrides": list(hc.overrides.task),
            "mode": str(hc.mode.name) if hc.mode is not None else None,
            "job_num": job.get("num"),
            "output_dir": hc.runtime.output_dir,
            "cwd": hc.runtime.cwd,
        }
    except Exception:  # pragma: no cover - informational only
        return None


def _jax_options() -> dict:
    import jax

    out = {}
    for name in JAX_OPTIONS:
        try:
            out[name] = getattr(jax.config, name)
        except AttributeError:
            out[name] = None
    return out


def run_info(devices) -> dict:
    """Everything but the config that is needed to reproduce a run on ``devices``.

    Args:
      devices: the devices the mesh is built on (``jax.Device`` list).

    Returns:
      JSON-able dict: ``lcx`` (version), ``git_commit``, ``git_dirty``, ``git_branch``,
      ``python``, ``platform``, ``packages`` (versions of :func:`packages`), ``xla_flags``,
      ``jax_platforms``, ``environment`` (:data:`ENV_VARS` that are set), ``jax_config``
      (:data:`JAX_OPTIONS`), ``backend`` and ``backend_version``, ``device_kind``,
      ``device_count`` (devices in the mesh), ``devices_visible`` (all devices JAX has),
      ``process_count``, ``command`` (argv), ``hydra`` (overrides, mode, job number).
    """
    import jax
    import jax.extend.backend

    import lcx

    git = git_state()
    try:
        backend = jax.extend.backend.get_backend()
        backend_info = {"backend": backend.platform, "backend_version": backend.platform_version}
    except Exception:  # pragma: no cover - informational only
        backend_info = {"backend": jax.default_backend(), "backend_version": None}
    return {
        "lcx": lcx.__version__,
        "git_commit": git["commit"],
        "git_dirty": git["dirty"],
        "git_branch": git["branch"],
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": {p: _version(p) for p in packages()},
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "jax_platforms": os.environ.get("JAX_PLATFORMS", ""),
        "environment": {k: os.environ[k] for k in ENV_VARS if k in os.environ},
        "jax_config": _jax_options(),
        **backend_info,
        "device_kind": devices[0].device_kind if devices else None,
        "device_count": len(devices),
        "devices_visible": jax.device_count(),
        "process_count": jax.process_count(),
        "command": [sys.executable, *sys.argv],
        "hydra": _hydra(),
    }
