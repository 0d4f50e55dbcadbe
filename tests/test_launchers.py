"""Cluster launchers through Hydra (hydra-submitit-launcher): `hydra/launcher=submitit_local` runs
a real 2-job multirun through submitit's local executor (one subprocess per job, as on SLURM), and
lcx's `hydra/launcher=slurm` composes to the plugin's SLURM launcher with lcx's defaults."""

from __future__ import annotations

import pytest
from _multirun import multirun, one_step_job
from hydra import compose, initialize_config_module

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason='needs pip install -e ".[cluster]"')


@pytest.mark.slow
def test_submitit_local_multirun_leaves_two_complete_run_dirs(tmp_path):
    """Two jobs, each in its own process started by submitit: each leaves metrics.jsonl with a
    finite loss for its one step, run_info.json naming its plan, and Hydra's saved config."""
    sweep = tmp_path / "mr"
    runs = multirun(
        sweep,
        "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=10",
        "plan=allgather,ring",
        "train.seq_len=256",
        "train.steps=1",
        "train.eval_every=0",
        "data=passkey",
        "model.n_layers=1",
    )
    assert len(runs) == 2, runs
    assert {one_step_job(d)["config"]["plan"]["name"] for d in runs} == {"allgather", "ring"}
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
