"""Progressive length extension: a 2-stage schedule (128 -> 256 tokens, plain RoPE -> YaRN, 2 steps
each) hands over through one checkpoint directory with per-stage learning rates; every stage's
plan is validated before training; checkpoints accept RoPE changes but no others; the shipped
experiment composes and validates; a finished schedule re-run trains nothing."""

from __future__ import annotations

import json
import logging

import jax
import numpy as np
import pytest
from _compile_cache import compile_cache
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf, open_dict

from lcx.config import run_config, schedule_config, stages
from lcx.sharding import PlanError
from lcx.training.checkpoint import Checkpoints
from lcx.training.optim import make_optimizer
from lcx.training.preflight import check
from lcx.training.resume import CheckpointMismatchError, check_compatible
from lcx.training.schedule import run_schedule, stage_config, stages_from_list

YARN = {"rope_scaling_type": "yarn", "rope_scaling_factor": 2.0, "rope_original_max_len": 128}
STAGES = [
    {"name": "short", "seq_len": 128, "steps": 2, "lr": 3e-3, "warmup_steps": 1},
    {"name": "long", "seq_len": 256, "steps": 2, "lr": 1e-3, "warmup_steps": 1, "model": YARN},
]


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    """The schedules below share the tiny model's initialisers and stage steps: compile each program once."""
    with compile_cache(tmp_path_factory.mktemp("xla_cache")):
        yield


def _config(*overrides, stages=None):
    with initialize_config_module(config_module="lcx.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    if stages is not None:
        with open_dict(cfg):
            cfg.schedule = {"stages": stages}
    return cfg


def _extend(cfg, run_dir, devices):
    """What ``python -m lcx.extend`` runs: the base run and its stages, typed once."""
    return run_schedule(schedule_config(cfg), run_dir, devices)


def _metrics(d):
    return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]


def _meta(ckpt, step):
    c = Checkpoints(ckpt, read_only=True)
    try:
        return c.read_meta(step)
    finally:
        c.close()


@pytest.mark.slow
def test_two_stage_schedule_hands_over_through_the_checkpoint(tmp_path, devices, caplog):
    ckpt = tmp_path / "ckpt"
    cfg = _config(
        "model=tiny",
        "plan=allgather",
        "train.global_batch=2",
        "train.eval_every=0",
        f"checkpoint.dir={ckpt}",
        "checkpoint.every=0",
        stages=STAGES,
    )
    # optax's Adam bias correction computes `float ** int32 step`, which strict promotion refuses
    with caplog.at_level(logging.WARNING, logger="lcx.training.resume"), jax.numpy_dtype_promotion("standard"):
        out = _extend(cfg, tmp_path / "run", devices)
    assert [(s.first_step, s.last_step, s.start_step) for s in out] == [(1, 2, 0), (3, 4, 2)]
    assert all(s.final_loss is not None and np.isfinite(s.final_loss) for s in out)
    assert "model.rope_scaling_type: None -> 'yarn'" in caplog.text  # the change is logged, not refused

    m0, m1 = _metrics(tmp_path / "run" / "stage0_short"), _metrics(tmp_path / "run" / "stage1_long")
    assert [r["step"] for r in m0] == [1, 2] and [r["step"] for r in m1] == [3, 4]
    assert m1[0]["resumed_from"] == 2
    # each stage runs its own schedule: warmup (1 step: the peak at once), then the cosine down to
    # its own final rate, lr * min_lr_ratio (0.1), at its last step
    assert [r["lr"] for r in m0] == [pytest.approx(3e-3), pytest.approx(3e-4)]
    assert [r["lr"] for r in m1] == [pytest.approx(1e-3), pytest.approx(1e-4)]
    # tokens per step doubled with the sequence length
    assert m1[0]["tokens_per_sec"] * m1[0]["step_time_s"] == pytest.approx(2 * 256)

    c = Checkpoints(ckpt, read_only=True)
    try:
        assert c.steps() == [2, 4]
    finally:
        c.close()
    s2, s4 = _meta(ckpt, 2), _meta(ckpt, 4)
    assert s2["config"]["train"]["seq_len"] == 128 and s2["config"]["model"]["rope_scaling_type"] is None
    assert s4["config"]["train"]["seq_len"] == 256 and s4["config"]["model"]["rope_scaling_type"] == "yarn"
    assert s4["config"]["train"]["schedule_start"] == 2 and "schedule" not in s4["config"]
    assert s4["data"]["seq_len"] == 256  # the stream continued at the new length
    assert json.loads((tmp_path / "run" / "schedule.json").read_text())[1]["model"] == YARN

    again = _extend(cfg, tmp_path / "run2", devices)  # finished: both stages skipped
    assert [s.skipped for s in again] == [True, True]
    assert not (tmp_path / "run2" / "stage0_short").exists()


def test_every_stage_plan_is_validated_before_training(tmp_path, devices):
    bad = [STAGES[0], {**STAGES[1], "seq_len": 260}]  # zigzag over 4 context devices needs S % 8 == 0
    cfg = _config("plan=allgather", "train.global_batch=2", f"checkpoint.dir={tmp_path / 'ckpt'}", stages=bad)
    with pytest.raises(PlanError, match=r"schedule stage 1 \('long', seq_len=260\)"):
        _extend(cfg, tmp_path / "run", devices)
    assert not (tmp_path / "run" / "stage0_short").exists()  # nothing trained
    # a warmup longer than its stage: refused before stage 0 trains, naming the stage's own key
    long_warmup = [STAGES[0], {**STAGES[1], "warmup_steps": STAGES[1]["steps"] + 5}]
    cfg = _config(f"checkpoint.dir={tmp_path / 'ckpt'}", stages=long_warmup)
    with pytest.raises(ValueError, match=r"schedule stage 1 .*set schedule\.stages\.1\.warmup_steps to at most"):
        _extend(cfg, tmp_path / "run", devices)
    assert not (tmp_path / "run" / "stage0_short").exists()
    with pytest.raises(ValueError, match="checkpoint.dir"):
        _extend(_config(stages=STAGES), tmp_path / "run", devices)
    with pytest.raises(ValueError, match="unknown keys \\['sequence_length'\\]"):
        stages_from_list([{"sequence_length": 8, "seq_len": 8, "steps": 1, "lr": 1.0}])
    with pytest.raises(ValueError, match="schedule.stages"):
        stages(_config())


def test_shipped_experiment_composes_and_validates(devices):
    cfg = _config("experiment=length_extension")
    run, schedule = run_config(cfg, tool="lcx.extend"), stages(cfg)
    assert [s.seq_len for s in schedule] == [1024, 4096]
    for i in range(len(schedule)):
        c = stage_config(run, schedule, i)
        check(c, devices)
        assert c.model.rope_scaling_type == (None if i == 0 else "yarn")
        assert c.train.steps == sum(s.steps for s in schedule[: i + 1])
    assert OmegaConf.select(cfg, "checkpoint.dir") == "checkpoints/length_extension"


def test_checkpoints_accept_rope_changes_only():
    saved = {"config": {"model": {"d_model": 128, "rope_theta": 1e4, "rope_scaling_type": None, "remat": "none"}}}
    # RoPE fields (and fields an older checkpoint lacks, such as rope_beta_fast) may differ
    check_compatible(
        saved,
        {"d_model": 128, "rope_theta": 5e5, "rope_scaling_type": "yarn", "rope_beta_fast": 32.0, "remat": "full"},
        where="ckpt/2",
    )
    with pytest.raises(CheckpointMismatchError, match="model.d_model=128 but this run has model.d_model=64"):
        check_compatible(saved, {"d_model": 64, "rope_scaling_type": "yarn", "rope_theta": 1e4}, where="ckpt/2")


def test_stage_learning_rate_schedule_is_shifted():
    _, whole = make_optimizer(lr=1.0, steps=10, warmup_steps=2)
    _, stage = make_optimizer(lr=1.0, steps=30, warmup_steps=2, schedule_start=20)
    for c in range(10):
        assert float(stage(20 + c)) == pytest.approx(float(whole(c)))
    with pytest.raises(ValueError, match="schedule_start"):
        make_optimizer(lr=1.0, steps=20, warmup_steps=0, schedule_start=20)


@pytest.mark.slow
def test_generated_passkey_stream_continues_across_a_length_change(tmp_path, devices):
    """data=passkey draws each row from (seed, row index): stage two continues at the next row
    at its own length (with another batch size) instead of refusing the checkpoint's seq_len."""
    ckpt = tmp_path / "ckpt"
    stages = [
        {"name": "short", "seq_len": 256, "steps": 1, "lr": 3e-3, "warmup_steps": 1, "global_batch": 4},
        {"name": "long", "seq_len": 512, "steps": 1, "lr": 1e-3, "warmup_steps": 1, "model": YARN},
    ]
    cfg = _config(
        "model=tiny",
        "data=passkey",
        "plan=allgather",
        "train.global_batch=2",
        "train.eval_every=0",
        f"checkpoint.dir={ckpt}",
        "checkpoint.every=0",
        stages=stages,
    )
    with jax.numpy_dtype_promotion("standard"):
        out = _extend(cfg, tmp_path / "run", devices)
    assert [(s.first_step, s.last_step) for s in out] == [(1, 1), (2, 2)]
    data = _meta(ckpt, 2)["data"]
    assert (data["seq_len"], data["row"]) == (512, 4 + 2)  # 4 rows of stage one, then 2 of stage two


def test_passkey_experiment_composes_and_every_stage_validates(devices):
    """experiment=passkey (experiments/passkey.py): the 256 -> 512 -> 1024 curriculum under the
    ring plan; check() validates each stage's plan, model and memory on the devices."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="lcx.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=passkey", "checkpoint.dir=unused"])
    run, schedule = run_config(cfg, tool="lcx.extend"), stages(cfg)
    assert [(s.seq_len, s.global_batch) for s in schedule] == [(256, 32), (512, 16), (1024, 8)]
    for i in range(len(schedule)):
        mp = check(stage_config(run, schedule, i), devices)
        assert mp.plan.attention.strategy == "ring" and mp.context_degree == 4
