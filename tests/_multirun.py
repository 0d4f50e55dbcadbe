"""A Hydra multirun of ``python -m lcx.train`` in a subprocess, as the experiment and launcher
tests run it: 8 simulated CPU devices, whatever XLA_FLAGS the test process has removed."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent


def multirun(sweep: pathlib.Path, *overrides: str) -> list[pathlib.Path]:
    """Run ``python -m lcx.train -m <overrides> hydra.sweep.dir=<sweep>`` from the repository root.

    Returns:
      Each job's run directory (the ones holding a ``metrics.jsonl``), sorted.

    Raises:
      AssertionError: the multirun exits non-zero (with the end of its stderr).
    """
    cmd = [sys.executable, "-m", "lcx.train", "-m", *overrides, f"hydra.sweep.dir={sweep}"]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return sorted(p.parent for p in sweep.rglob("metrics.jsonl"))


def one_step_job(run_dir: pathlib.Path) -> dict:
    """Check a one-step job's run directory (a finite loss at step 1, 8 devices, Hydra's saved
    config); return its ``run_info.json``."""
    rec = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rec and rec[-1]["step"] == 1 and np.isfinite(rec[-1]["loss"])
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["device_count"] == 8
    assert (run_dir / ".hydra" / "config.yaml").exists()
    return info
