"""Checkpoints that survive faults and change plans (orbax): save and restore a
:class:`~lcx.training.state.TrainState`, nothing else (what a run may resume from is
:mod:`lcx.training.resume`'s).

A checkpoint is one orbax step directory ``<checkpoint.dir>/<step>/`` with two items:

- ``state`` (``StandardSave``): ``{"params": ..., "opt_state": ...}`` (:meth:`TrainState.arrays`),
  every array written by the devices that hold it, with its logical shape; nothing about the
  writer's mesh is needed to read it back.
- ``meta`` (``JsonSave``): the state's step, data stream position and RNG key data
  (:meth:`TrainState.meta`), plus what the caller adds: the last loss and the resolved
  configuration of the run.

Saves are asynchronous: :meth:`Checkpoints.save` returns once the arrays are copied to host
memory, and a background thread writes them into a temporary directory that orbax renames to
``<step>`` only when every file is written. A process killed at any moment (mid-save
included) therefore leaves only complete step directories plus, at worst, a temporary one,
which the next :class:`Checkpoints` deletes.

Restoring builds its targets from abstract arrays (``jax.ShapeDtypeStruct``) that carry the
*new* run's shardings, so a checkpoint written under one plan (ring over 8 devices) is read
directly into another (USP 2x4, FSDP, one device): each device reads only its own shard.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import pathlib
import shutil
from collections.abc import Callable, Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp

from lcx.training.state import TrainState, nonfinite_leaves

log = logging.getLogger(__name__)

# Sub-directory of checkpoint.dir that unreadable checkpoints are moved into. Its name is not a
# step number, so orbax never mistakes it (or anything inside it) for a checkpoint.
CORRUPT_DIR = "corrupt"
# What orbax appends to a step directory's name while the step is being written.
TMP_SUFFIX = ".orbax-checkpoint-tmp"


class NoUsableCheckpointError(RuntimeError):
    """Checkpoints exist but none of them can be read."""


class CheckpointSaveError(RuntimeError):
    """A save failed (disk full, permissions, ...): names the step, the cause and what was kept."""


@dataclasses.dataclass
class Restored:
    """A restored checkpoint: ``step`` (completed optimizer steps), ``state`` (the
    :class:`TrainState`, its arrays placed by the restore target's shardings), ``meta`` (the
    whole ``meta`` item, dict)."""

    step: int
    state: TrainState
    meta: dict[str, Any]


class Checkpoints:
    """Save and restore training state in one directory with an orbax ``CheckpointManager``.

    Args:
      directory: where step directories live (created if missing).
      keep: most recent checkpoints kept, ``>= 1``.
      async_save: write in a background thread (:meth:`save` returns after the device-to-host
        copy, so the caller may donate or overwrite its arrays at once).
      read_only: only read: nothing is created, deleted or moved (safe on the directory of a
        run that is still writing to it).

    Unless ``read_only``, leftover temporary directories of interrupted saves are deleted on
    construction: only the run that owns the directory may open it writable.

    A save that fails (a full disk, in the background or not) is never listed or restored: only
    finalized step directories are. Its error is raised, naming the step and the cause, by the
    first :meth:`check`, :meth:`wait`, :meth:`save` or :meth:`close` after it ended; its
    temporary files are deleted, older checkpoints are kept, and the step can be saved again.
    """

    def __init__(
        self, directory: str | os.PathLike, *, keep: int = 3, async_save: bool = True, read_only: bool = False
    ):
        self.directory = pathlib.Path(directory).absolute()
        absl_log = logging.getLogger("absl")
        if absl_log.level == logging.NOTSET:
            # orbax reports every save phase at INFO through absl: dozens of lines per save in a
            # Hydra run (root logger at INFO). Keep its warnings; a user-set level is respected.
            absl_log.setLevel(logging.WARNING)
        self.read_only = bool(read_only)
        if not self.read_only:
            self.directory.mkdir(parents=True, exist_ok=True)
        self._keep = int(keep)
        self._async = bool(async_save)
        self._pending: int | None = None  # the step of the save in flight
        self._failed: tuple[int, BaseException] | None = None  # a failed save not yet raised
        if not self.read_only:
            self._remove_interrupted_saves()
        self._manager = self._open()

    def _remove_interrupted_saves(self) -> None:
        # orbax writes a step into `<step>.orbax-checkpoint-tmp*` and renames it when complete; a
        # leftover one is a save that a kill interrupted. orbax's own cleanup runs in the
        # background; doing it here, first, means no later listing can ever see one.
        if jax.process_index() != 0:
            return
        for p in sorted(self.directory.iterdir()):
            if TMP_SUFFIX in p.name:
                log.warning("removing %s: a save interrupted before it completed", p)
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)

    def _open(self) -> ocp.CheckpointManager:
        if self.read_only:
            options = ocp.CheckpointManagerOptions(read_only=True, create=False, enable_async_checkpointing=False)
        else:
            options = ocp.CheckpointManagerOptions(
                max_to_keep=self._keep,
                create=True,
                cleanup_tmp_directories=True,  # remnants of saves a SIGKILL interrupted
                enable_async_checkpointing=self._async,
            )
        return ocp.CheckpointManager(self.directory, item_names=("state", "meta"), options=options)

    # -- queries ----------------------------------------------------------------------------

    def steps(self) -> list[int]:
        """Steps of the complete (finalized) checkpoints, ascending: never the save in flight nor
        a failed one (orbax lists a step as soon as its save starts). Does not raise a failed
        save's error (:meth:`check` does)."""
        self._collect(block=False)
        return sorted(s for s in self._manager.all_steps() if s != self._pending and (self.directory / str(s)).is_dir())

    def latest_step(self) -> int | None:
        s = self.steps()
        return s[-1] if s else None

    # -- saving -----------------------------------------------------------------------------

    def save(self, state: TrainState, meta: Mapping[str, Any] | None = None) -> bool:
        """Start saving ``state`` as checkpoint ``state.step``; returns False if that step is
        already saved. Waits for the previous save first (at most one is in flight).

        Args:
          state: the state to write (its arrays, and :meth:`TrainState.meta` in the ``meta`` item).
          meta: more JSON for the ``meta`` item (loss, config, ...); the state's own keys win.

        Raises:
          FloatingPointError: a parameter or optimizer-state tensor is not finite (the message
            lists them): a poisoned checkpoint is never written.
        """
        step = int(state.step)
        self.check(wait=True)  # at most one save in flight; a failed one is raised, naming its step
        if step in self.steps():
            return False
        bad = nonfinite_leaves(state.arrays())
        if bad:
            raise FloatingPointError(
                f"refusing to checkpoint step {step}: non-finite values in {', '.join(bad[:8])}"
                + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
                + "; the last good checkpoint is kept. Lower train.lr or check the data"
            )
        meta = {**(meta or {}), **state.meta()}
        self._pending = int(step)
        try:
            started = self._manager.save(
                int(step),
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state.arrays()),
                    meta=ocp.args.JsonSave(meta),
                ),
                force=True,
            )
        except Exception as e:  # noqa: BLE001 - a synchronous failure: the same path as a background one
            self._pending = None
            self._failed = (int(step), e)
            self._recover(int(step))
            self.check()  # raises the failure just recorded
            return False
        if not self._async:
            self.check(wait=True)
        return bool(started)

    def check(self, wait: bool = False) -> None:
        """Raise the error of a save that failed, once (the next save starts clean).

        Args:
          wait: block until the save in flight ends; False: look only at a save that has ended.

        Raises:
          CheckpointSaveError: names the failed step, the cause and the checkpoints kept.
        """
        self._collect(block=wait)
        if self._failed is None:
            return
        step, e = self._failed
        self._failed = None
        cause = str(e).splitlines()[0] if str(e) else ""
        if len(cause) > 400:  # keep both ends: the failing file and the OS error ("No space left on device")
            cause = cause[:200] + " ... " + cause[-200:]
        raise CheckpointSaveError(
            f"checkpoint of step {step} in {self.directory} failed: {type(e).__name__}: {cause}. Nothing of it is "
            f"listed or restored; the checkpoints kept are steps {self.steps()}. Fix the cause (e.g. free disk space) "
            f"and save again: step {step} can be saved anew"
        ) from e

    def _collect(self, block: bool) -> None:
        """Finish the bookkeeping of the save in flight if it ended (or, ``block``, when it ends)."""
        if self._pending is None:
            return
        if not block and self._manager.is_saving_in_progress():
            return
        step, self._pending = self._pending, None
        try:
            self._manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - whatever the writer raised is the cause to report
            self._failed = (step, e)
            self._recover(step)

    def _recover(self, step: int) -> None:
        """After a failed save of ``step``: delete its temporary files and reopen orbax (whose
        manager would otherwise keep listing the step and raise its error again)."""
        if jax.process_index() == 0:
            for p in self.directory.glob(f"{step}{TMP_SUFFIX}*"):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        try:
            self._manager.close()
        except Exception:  # noqa: BLE001, S110 - the error is the one already recorded
            pass
        self._manager = self._open()

    def wait(self) -> None:
        """Block until the save in flight (if any) is on disk.

        Raises:
          CheckpointSaveError: it (or an earlier one not yet raised) failed.
        """
        self.check(wait=True)

    def close(self) -> None:
        """Finish the save in flight and release orbax's threads.

        Raises:
          CheckpointSaveError: the last save failed (orbax's threads are released all the same).
        """
        try:
            self.check(wait=True)
        finally:
            self._manager.close()

    # -- restoring --------------------------------------------------------------------------

    def read_meta(self, step: int) -> dict[str, Any]:
        """The ``meta`` item of checkpoint ``step`` (JSON), without touching any array.

        Raises:
          Exception: whatever orbax raises for a missing or unreadable item.
        """
        out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        meta = out["meta"]
        if not isinstance(meta, dict) or "step" not in meta:
            raise ValueError(f"meta item has no 'step': {str(meta)[:200]}")
        return meta

    def restore(self, step: int, target: TrainState) -> Restored:
        """Read checkpoint ``step`` into ``target``'s shapes, dtypes and shardings.

        Args:
          step: a step from :meth:`steps`.
          target: a :class:`TrainState` of ``jax.ShapeDtypeStruct`` with the shardings wanted now
            (:func:`lcx.training.resume.abstract_train_state`); may be a different plan than the
            writer's. Its ``step``, ``rng`` and ``data`` are ignored: the checkpoint's are read.

        Raises:
          Exception: orbax's error for a missing, partial or corrupt checkpoint, or for shapes
            that do not match ``target``.
        """
        out = self._manager.restore(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardRestore(target.arrays()), meta=ocp.args.JsonRestore()),
        )
        meta = dict(out["meta"])
        return Restored(step=int(step), state=TrainState.from_checkpoint(out["state"], meta), meta=meta)

    def restore_latest(
        self,
        target: TrainState | Callable[[], TrainState],
        *,
        check: Callable[[dict[str, Any], str], None] | None = None,
    ) -> Restored | None:
        """The newest checkpoint that reads back completely, or None if there is none.

        Newest first: an unreadable checkpoint (partial, corrupt, truncated files, bad JSON) is
        reported with ``logging.warning``, moved to ``<dir>/corrupt/`` (so that later saves of
        the same step and orbax's garbage collection are not confused by it), and the previous
        one is tried.

        Args:
          target: the restore target, or a function that builds it (called once, only if a
            checkpoint exists).
          check: called as ``check(meta, path)`` before any array is read; raise to refuse the
            checkpoint (e.g. :func:`lcx.training.resume.check_resumable`). Its errors propagate
            unchanged: a refused checkpoint is not corrupt, and silently starting over would hide
            the mistake.

        Raises:
          NoUsableCheckpointError: checkpoints exist but none reads back.
        """
        steps = self.steps()
        if not steps:
            return None
        tgt = None
        failures = []
        for step in reversed(steps):
            where = str(self.directory / str(step))
            try:
                meta = self.read_meta(step)
            except Exception as e:  # noqa: BLE001 - any read failure means "unusable"
                failures.append(self._set_aside(step, e))
                continue
            if check is not None:
                check(meta, where)
            if tgt is None:
                tgt = target() if callable(target) else target
            try:
                restored = self.restore(step, tgt)
                _check_restored(restored.state.arrays(), tgt.arrays())
            except Exception as e:  # noqa: BLE001
                failures.append(self._set_aside(step, e))
                continue
            if failures:
                log.warning("resuming from %s after skipping unreadable checkpoints: %s", where, "; ".join(failures))
            return restored
        raise NoUsableCheckpointError(
            f"no checkpoint in {self.directory} could be read ({'; '.join(failures)}); the unreadable ones were "
            f"moved to {self.directory / CORRUPT_DIR}. Start afresh with another checkpoint.dir, or repair them"
        )

    def _set_aside(self, step: int, error: BaseException) -> str:
        src = self.directory / str(step)
        msg = f"step {step}: {type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"
        if not self.read_only and jax.process_index() == 0 and src.exists():
            stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S%f")
            dst = self.directory / CORRUPT_DIR / f"step{step}-{stamp}"
            dst.parent.mkdir(exist_ok=True)
            shutil.move(str(src), str(dst))
            msg += f" (moved to {dst})"
        log.warning("checkpoint %s is unreadable and was skipped: %s", src, msg)
        # orbax caches the step list: re-read it so the set-aside step is forgotten
        self._manager.reload()
        return msg


def _check_restored(state: Mapping[str, Any], target: Mapping[str, Any]) -> None:
    """Orbax fills missing shards of a damaged array with zeros in some versions; refuse a
    restored tree whose structure, shapes or dtypes differ from the target's."""
    a, ta = jax.tree.flatten(state)
    b, tb = jax.tree.flatten(target)
    if ta != tb:
        raise ValueError(f"restored tree structure differs from the target: {ta} vs {tb}")
    for x, t in zip(a, b):
        if x.shape != t.shape or x.dtype != t.dtype:
            raise ValueError(f"restored array {x.shape} {x.dtype} differs from target {t.shape} {t.dtype}")


__all__ = [
    "CORRUPT_DIR",
    "CheckpointSaveError",
    "Checkpoints",
    "NoUsableCheckpointError",
    "Restored",
    "TMP_SUFFIX",
]
