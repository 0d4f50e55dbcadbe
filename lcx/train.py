"""Hydra entry point: ``python -m lcx.train [overrides]``.

Groups: ``model=`` (tiny | llama3_1_8b | llama3_70b | llama3_1_8b_longctx), ``plan=`` (dp | fsdp |
allgather | a2a | ring | usp | fsdp_ring), ``hardware=`` (cpu | tpu_v5p | tpu7), ``data=`` (stdlib |
text), ``experiment=``. Writes ``metrics.jsonl`` and ``run_info.json`` in the Hydra run directory.

``train.dry_run=true`` validates the plan and checks memory for the hardware preset's device
count (``hardware.chips x hardware.devices_per_chip``), prints the memory anatomy, writes
``dry_run.json`` and exits without devices or compiling (:func:`dry_run`).
"""

from __future__ import annotations

import os
import sys

import hydra

import lcx.conf  # noqa: F401  (registers the structured plan schema with Hydra)
from omegaconf import DictConfig


def configure_devices(cfg: DictConfig) -> list:
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

    n = cfg.hardware.cpu_devices
    if n:
        try:
            if not os.environ.get("JAX_PLATFORMS"):
                jax.config.update("jax_platforms", "cpu")  # no accelerator probe on the CPU preset
            jax.config.update("jax_num_cpu_devices", int(n))
        except RuntimeError:
            pass  # backend already initialised (second job of a multirun): checked below
    dist = cfg.get("distributed")  # lcx.eval's config has none: one process
    if dist is not None and dist.auto:
        jax.distributed.initialize()
    elif dist is not None and dist.coordinator_address:
        jax.distributed.initialize(
            coordinator_address=str(dist.coordinator_address),
            num_processes=int(dist.num_processes),
            process_id=int(dist.process_id),
        )
    devices = jax.devices()
    name = str(cfg.hardware.name)
    if name != "cpu" and jax.default_backend() == "cpu":
        raise ValueError(
            f"hardware={name} but JAX found no accelerator backend (only cpu: {len(devices)} device(s)); "
            "use hardware=cpu on this machine, or install the JAX build for that hardware"
        )
    if jax.process_count() > 1:
        return devices
    if n:
        if len(devices) < int(n):
            raise ValueError(
                f"hardware.cpu_devices={n} but JAX has only {len(devices)} devices (the count is fixed by "
                "the first job of a multirun); run the largest count first or in its own process"
            )
        return devices[: int(n)]
    return devices


USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, NotImplementedError, FloatingPointError)
"""Errors that describe a problem with the configuration or the data (PlanError and the data,
model and checkpoint errors are ValueErrors): the entry points print their message in one line."""


def explain_errors(fn, *args):
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
    key, before Hydra composes (:func:`lcx.conf.schema.check_overrides`); exits with status 2."""
    from lcx.conf.schema import check_overrides

    explain_errors(check_overrides, sys.argv[1:], tool)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> float | None:
    return explain_errors(_main, cfg)


def main() -> float | None:
    check_command_line("lcx.train")
    return _hydra_main()


def _main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    from lcx.conf import boolean
    from lcx.cost import apply_hardware_flags

    from lcx.conf.schema import check_train_config

    check_train_config(cfg)  # every key known and typed, before any device or compile
    if boolean(cfg.train.dry_run, "train.dry_run",
               "validate the plan and check memory for the configured hardware, without devices"):
        dry_run(cfg, HydraConfig.get().runtime.output_dir)
        return None
    apply_hardware_flags(cfg.hardware)  # XLA/libtpu flags must be set before the backend starts
    devices = configure_devices(cfg)
    from lcx.training.loop import train

    out = train(cfg, HydraConfig.get().runtime.output_dir, devices)
    print(done_message(out, int(cfg.train.steps)), file=sys.stderr)
    return out["val_loss"]


def dry_run(cfg: DictConfig, out_dir=None) -> dict:
    """``train.dry_run=true``: :func:`lcx.training.preflight.dry_run` before any device is configured.

    The run is validated for ``hardware.chips x hardware.devices_per_chip`` devices (the
    simulated CPU devices on ``hardware=cpu``) and its memory checked against the preset, so
    ``python -m lcx.train experiment=longctx_14m_tpu7 train.dry_run=true`` checks a 128-device
    TPU 7 run on a CPU machine. No JAX backend starts (the platform is pinned to cpu unless
    ``JAX_PLATFORMS`` says otherwise, in case anything touched one), no distributed runtime is
    joined and nothing compiles.

    Raises:
      PlanError / ValueError: what a real run would refuse before compiling.
    """
    import jax

    if not os.environ.get("JAX_PLATFORMS"):
        jax.config.update("jax_platforms", "cpu")  # never probe or start an accelerator here
    from lcx.training.preflight import dry_run as _dry_run

    return _dry_run(cfg, out_dir)


def done_message(out: dict, steps: int) -> str:
    """The last line of a run: the losses this run computed, or, when a resumed run found its
    checkpoint already at ``train.steps``, that there was nothing to train (no loss is printed
    that this run did not compute)."""
    if not out["losses"]:
        return (f"done: checkpoint at step {out['start_step']} already reached train.steps={steps}; nothing to "
                f"train (raise train.steps to continue); run directory {out['run_dir']}")
    return (
        f"done: final train loss {out['final_loss']:.4f} nats/token"
        + (f", validation loss {out['val_loss']:.4f}" if out["val_loss"] is not None else "")
        + f"; run directory {out['run_dir']}"
    )


if __name__ == "__main__":
    main()
