"""Graceful stops: SIGTERM or SIGINT during training saves a checkpoint of the current step,
then exits with ``128 + signal number`` (:func:`exit_after_save`)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Any

log = logging.getLogger(__name__)


class StopSignals:
    """While active, SIGTERM and SIGINT only set ``signum``; the loop saves and exits at the end
    of the current step. A second signal restores the previous action and re-raises it, so a
    stuck save can still be interrupted. With ``enabled=False`` (no checkpointing) or outside
    the main thread (where Python forbids signal handlers) this does nothing."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum, frame):
        if self.signum is not None:
            signal.signal(signum, self._old.get(signum, signal.SIG_DFL))
            os.kill(os.getpid(), signum)
            return
        self.signum = signum
        print(
            f"{signal.Signals(signum).name} received: saving a checkpoint after this step "
            "(send it again to exit without saving)",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self):
        if self.enabled and threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        return False


def exit_after_save(signum: int, ckpts: Any, step: int) -> None:
    """Wait for the checkpoint of ``step`` to be on disk, say so, and exit.

    Raises:
      SystemExit: always, with code ``128 + signum``.
      CheckpointSaveError: the save failed (from ``ckpts.wait()``).
    """
    ckpts.wait()
    name = signal.Signals(signum).name
    msg = f"{name}: checkpoint of step {step} saved in {ckpts.directory}; exiting"
    log.warning(msg)
    print(msg, file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


__all__ = ["StopSignals", "exit_after_save"]
