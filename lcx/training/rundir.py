"""The run directory and where configured paths point: the launch directory, the Hydra
multirun job, claiming ``run_dir`` for one run, and keeping what earlier attempts wrote.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lcx.training.preflight import Run

log = logging.getLogger(__name__)


def launch_dir() -> pathlib.Path:
    """The directory the run was launched from: Hydra's ``runtime.cwd`` when Hydra runs the job
    (it may have changed the working directory), else the current directory."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return pathlib.Path(HydraConfig.get().runtime.cwd)
    except ImportError:  # pragma: no cover - hydra is a dependency
        pass
    return pathlib.Path.cwd()


def multirun_job() -> dict[str, Any] | None:
    """``{"sweep_dir", "job", "output_dir"}`` of the Hydra multirun job this process runs, or None
    outside a multirun."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.initialized():
            hc = HydraConfig.get()
            if hc.mode == RunMode.MULTIRUN:
                return {
                    "sweep_dir": str(pathlib.Path(hc.sweep.dir).absolute()),
                    "job": int(hc.job.num),
                    "output_dir": str(hc.runtime.output_dir),
                }
    except ImportError:  # pragma: no cover - hydra is a dependency
        pass
    return None


def resolve_dir(d: Any, *, per_job: bool = False) -> pathlib.Path | None:
    """A configured directory as an absolute path (None or "": None). Relative paths resolve
    against :func:`launch_dir`, so ``checkpoint.dir=ckpt`` means the same place whatever Hydra
    does with the working directory; with ``per_job`` under a Hydra multirun, against the job's
    own directory (``<sweep dir>/<job subdir>/ckpt``), so the jobs of a sweep never share one."""
    if d in (None, ""):
        return None
    path = pathlib.Path(os.path.expanduser(str(d)))
    if path.is_absolute():
        return path
    job = multirun_job() if per_job else None
    return (pathlib.Path(job["output_dir"]) if job else launch_dir()) / path


class RunDirInUseError(ValueError):
    """The run directory holds another run's ``metrics.jsonl``."""


def claim_run_dir(run_dir: pathlib.Path, *, ckpt_dir: pathlib.Path | None, reuse: bool) -> None:
    """Make ``run_dir`` this run's, or refuse: nothing another run wrote is ever overwritten.

    - No ``metrics.jsonl`` there: it is created empty with ``O_EXCL``, so of two processes that
      race for one directory exactly one wins; the other is refused.
    - One there, written by a run with this run's ``checkpoint.dir`` (its ``run_info.json`` says
      so): the checkpoint-resume path; :func:`truncate_metrics` keeps the lines up to the
      restored step.
    - One there from another run: refused, unless ``reuse`` (``train.reuse_run_dir=true``), which
      renames that run's ``metrics.jsonl``, ``run_info.json`` and ``tensorboard/`` with a time
      stamp (kept, never deleted) and starts a new ``metrics.jsonl``.

    Raises:
      RunDirInUseError: another run's metrics are there and ``reuse`` is off; names the fix.
    """
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        if ckpt_dir is not None and _run_info_checkpoint_dir(run_dir) == str(ckpt_dir):
            return  # this run's own directory, resumed from its checkpoint
        if reuse:
            for p in (metrics, run_dir / "run_info.json", run_dir / "tensorboard"):
                kept = keep_aside(p)
                if kept is not None:
                    log.warning("train.reuse_run_dir=true: the previous run's %s is kept as %s", p.name, kept.name)
        else:
            raise RunDirInUseError(_in_use_message(run_dir))
    try:
        os.close(os.open(metrics, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:  # another process claimed it between the check and here
        raise RunDirInUseError(_in_use_message(run_dir)) from None


def _in_use_message(run_dir: pathlib.Path) -> str:
    return (
        f"run directory {run_dir} already holds another run's metrics.jsonl; refusing to overwrite it. Use a "
        f"new directory (the default hydra.run.dir is unique per launch; drop the hydra.run.dir override), resume "
        f"that run with its own checkpoint.dir, or set train.reuse_run_dir=true to keep its files (renamed) and "
        f"write this run there"
    )


def _run_info_checkpoint_dir(run_dir: pathlib.Path) -> str | None:
    try:
        return json.loads((run_dir / "run_info.json").read_text()).get("checkpoint_dir")
    except (OSError, ValueError, AttributeError):
        return None


def keep_aside(path: pathlib.Path) -> pathlib.Path | None:
    """Rename ``path`` to ``<stem>.<UTC time>.<suffix>`` if it exists; return the new path."""
    if not path.exists():
        return None
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"{time.time() % 1:.6f}"[1:]
    dst = path.with_name(f"{path.stem}.{stamp}{path.suffix}")
    os.replace(path, dst)
    return dst


def truncate_metrics(path: pathlib.Path, step: int) -> None:
    """Keep the lines of ``metrics.jsonl`` for steps ``<= step`` (a resumed run re-does the steps
    after its checkpoint; their first, lost attempt must not appear twice). Atomic rename, so a
    crash here leaves the old file or the new one, never half of one."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= step:
                keep.append(line)
        except (ValueError, KeyError, TypeError):
            break  # a line cut short by a crash: everything after it is untrustworthy
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(x + "\n" for x in keep))
    os.replace(tmp, path)


def write_run_info(run_dir: pathlib.Path, info: dict[str, Any]) -> None:
    """Write ``run_info.json``; an earlier attempt's (a resumed run) is kept aside, renamed."""
    keep_aside(run_dir / "run_info.json")
    (run_dir / "run_info.json").write_text(json.dumps(info, indent=2, default=str))


def record_run(run: Run, run_dir: pathlib.Path, start: int, *, resumed: bool) -> None:
    """Claim ``run_dir`` for ``run``, write its ``run_info.json`` (:func:`lcx.training.runinfo.run_info`
    with the run's config, plan, mesh and peak) and drop ``metrics.jsonl`` lines of steps after
    ``start`` (a crashed attempt's, redone now).

    Raises:
      RunDirInUseError: ``run_dir`` holds another run's metrics.
    """
    from lcx.training.runinfo import run_info

    c = run.config.checkpoint
    claim_run_dir(run_dir, ckpt_dir=c.dir, reuse=run.config.train.reuse_run_dir)
    info = run_info(run.devices)
    info["config"] = run.config.resolved
    info["plan"] = repr(run.mp.plan)
    info["mesh"] = dict(run.mp.mesh.shape)
    info["peak_flops_per_device"] = run.hw.peak_flops_per_device
    info["model_flops_per_step"] = run.flops.total
    info["checkpoint_dir"] = str(c.dir) if c.enabled else None
    info["resumed_from_step"] = start if resumed else None
    write_run_info(run_dir, info)
    truncate_metrics(run_dir / "metrics.jsonl", start)


__all__ = [
    "record_run",
    "RunDirInUseError",
    "claim_run_dir",
    "keep_aside",
    "launch_dir",
    "multirun_job",
    "resolve_dir",
    "truncate_metrics",
    "write_run_info",
]
