"""What the Hydra entry points share (``lcx.train``, ``lcx.plan``, ``lcx.eval``, ``lcx.extend``).

Each entry point is a shim: one function with the body, which turns the composed config into its
typed value once (:mod:`lcx.config`) and passes on the sections, a ``@hydra.main`` ``main(cfg)``
that runs it under :func:`explain_errors`, and ``if __name__ == "__main__": launch(tool, main)``.
:func:`launch` registers the structured configs (:func:`lcx.config.register`, an explicit call,
not an import side effect), refuses misspelt command-line keys, then hands over to Hydra.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lcx.training.config import DistributedConfig, HardwareConfig

CONFIG_PATH = "pkg://lcx.conf"
"""Where Hydra finds the YAML tree: the package ``lcx.conf``, installed from the repository's
top-level ``conf/`` (pyproject ``[tool.setuptools] package-dir``), in a checkout and a wheel alike."""

USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, NotImplementedError, FloatingPointError)
"""Errors that describe a problem with the configuration or the data (PlanError and the data,
model and checkpoint errors are ValueErrors): the entry points print their message in one line."""


def launch(tool: str, hydra_main: Callable[[], Any]) -> Any:
    """Run the ``@hydra.main`` function ``hydra_main`` of entry point ``tool`` (``"lcx.train"``):
    register the structured configs, refuse a misspelt command-line key, then let Hydra compose."""
    from lcx.config import register

    register()
    check_command_line(tool)
    return hydra_main()


def explain_errors(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(*args)``; an error in :data:`USER_ERRORS` is printed as one line (its message
    names the value and the fix) and exits with status 2. ``HYDRA_FULL_ERROR=1`` re-raises it
    with the whole traceback."""
    try:
        return fn(*args)
    except USER_ERRORS as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {e}\n(set HYDRA_FULL_ERROR=1 for the traceback)", file=sys.stderr)
        sys.exit(2)


def check_command_line(tool: str) -> None:
    """Refuse a misspelt key on the command line (``train.stpes=1``) naming the nearest valid
    key, before Hydra composes (:func:`lcx.config.schema.check_overrides`); exits with status 2."""
    from lcx.config.schema import check_overrides

    explain_errors(check_overrides, sys.argv[1:], tool)


def output_dir() -> str:
    """The Hydra run directory of the running job."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.output_dir


def pin_cpu() -> None:
    """Pin JAX to the CPU platform unless ``JAX_PLATFORMS`` says otherwise, before any backend
    starts: the planner and ``train.dry_run`` never need an accelerator, and pinning avoids
    probing absent TPU/GPU runtimes (and their log lines)."""
    import jax

    if not os.environ.get("JAX_PLATFORMS"):
        jax.config.update("jax_platforms", "cpu")


def configure_devices(hardware: HardwareConfig, distributed: DistributedConfig | None = None) -> list:
    """Set up devices before the JAX backend starts and return the devices to build the mesh on.

    On ``hardware=cpu``, each process gets ``hardware.cpu_devices`` simulated CPU devices. With
    ``distributed.coordinator_address`` set (or ``distributed.auto``), JAX's own multi-process
    runtime (``jax.distributed.initialize``) joins the processes first; ``jax.devices()`` then
    lists every process's devices and the mesh spans all of them. Under a Hydra multirun (one
    process) the first job fixes the device count; later jobs use the first ``cpu_devices``.

    Raises:
      ValueError: fewer devices exist than the configuration asks for.
    """
    import jax

    n = hardware.cpu_devices
    if n:
        try:
            if not os.environ.get("JAX_PLATFORMS"):
                jax.config.update("jax_platforms", "cpu")  # no accelerator probe on the CPU preset
            jax.config.update("jax_num_cpu_devices", n)
        except RuntimeError:
            pass  # backend already initialised (second job of a multirun): checked below
    dist = distributed  # lcx.eval's config has none: one process
    if dist is not None and dist.auto:
        jax.distributed.initialize()
    elif dist is not None and dist.coordinator_address:
        jax.distributed.initialize(
            coordinator_address=dist.coordinator_address,
            num_processes=dist.num_processes,
            process_id=dist.process_id,
        )
    devices = jax.devices()
    name = hardware.name
    if name != "cpu" and jax.default_backend() == "cpu":
        raise ValueError(
            f"hardware={name} but JAX found no accelerator backend (only cpu: {len(devices)} device(s)); "
            "use hardware=cpu on this machine, or install the JAX build for that hardware"
        )
    if jax.process_count() > 1:
        return devices
    if n:
        if len(devices) < n:
            raise ValueError(
                f"hardware.cpu_devices={n} but JAX has only {len(devices)} devices (the count is fixed by "
                "the first job of a multirun); run the largest count first or in its own process"
            )
        return devices[:n]
    return devices


def start_devices(hardware: HardwareConfig, distributed: DistributedConfig | None = None) -> list:
    """Set the hardware preset's XLA/libtpu flags (they must be set before the backend starts),
    then :func:`configure_devices`."""
    from lcx.cost import apply_hardware_flags

    apply_hardware_flags(hardware)
    return configure_devices(hardware, distributed)
