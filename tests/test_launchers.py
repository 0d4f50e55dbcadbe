"""Cluster launchers through Hydra (hydra-submitit-launcher): `hydra/launcher=submitit_local` runs
a real 2-job multirun through submitit's local executor (one subprocess per job, as on SLURM), and
lcx's `hydra/launcher=slurm` composes to the plugin's SLURM launcher with lcx's defaults."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from hydra import compose, initialize_config_module

ROOT = pathlib.Path(__file__).resolve().parent.parent
pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason='needs pip install -e ".[cluster]"')


def test_submitit_local_multirun_leaves_two_complete_run_dirs(tmp_path):
    """Two jobs, each in its own process started by submitit: each leaves metrics.jsonl with a
    finite loss for its one step, run_info.json naming its plan, and Hydra's saved config."""
    sweep = tmp_path / "mr"
    cmd = [
        sys.executable,
        "-m",
        "lcx.train",
        "-m",
        "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=10",
        "plan=allgather,ring",
        "train.seq_len=256",
        "train.steps=1",
        "train.eval_every=0",
        "data=passkey",
        "model.n_layers=1",
        f"hydra.sweep.dir={sweep}",
    ]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = sorted(p.parent for p in sweep.rglob("metrics.jsonl"))
    assert len(runs) == 2, runs
    plans = set()
    for d in runs:
        rec = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        assert rec[-1]["step"] == 1 and np.isfinite(rec[-1]["loss"])
        info = json.loads((d / "run_info.json").read_text())
        assert info["device_count"] == 8
        plans.add(info["config"]["plan"]["name"])
        assert (d / ".hydra" / "config.yaml").exists()
    assert plans == {"allgather", "ring"}
    # submitit's own record of the two jobs: one folder each, with their logs
    assert len([p for p in (sweep / ".submitit").iterdir() if p.is_dir() and p.name != "%j"]) == 2


def test_slurm_launcher_config_composes_with_lcx_defaults():
    """`hydra/launcher=slurm` is the plugin's SlurmLauncher with one task per node; its keys can be
    overridden from the command line like any other."""
    with initialize_config_module(config_module="lcx.conf", version_base=None):
        cfg = compose(
            config_name="config",
            overrides=["hydra/launcher=slurm", "hydra.launcher.nodes=4"],
            return_hydra_config=True,
        )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert launcher.nodes == 4 and launcher.tasks_per_node == 1
    assert launcher.timeout_min == 240 and launcher.signal_delay_s == 120 and launcher.max_num_timeout == 0
