"""TensorBoard events beside metrics.jsonl: every scalar of every logged step, read back with
TensorBoard's own event reader, equals the JSONL value (rounded to float32, what TensorBoard
stores); a resumed run purges the interrupted run's later steps as metrics.jsonl drops them."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from _compile_cache import compile_cache
from hydra import compose, initialize_config_module

from lcx.config import run_config
from lcx.training.hooks import tensorboard_tag

# real training runs: the floor stack (-m 'not slow') skips them
pytestmark = pytest.mark.slow

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    """The runs below share the tiny model's initialisers, some their train step too: compile each program once."""
    with compile_cache(tmp_path_factory.mktemp("xla_cache")):
        yield


def _config(*overrides):
    with initialize_config_module(config_module="lcx.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def _scalars(log_dir) -> dict[str, dict[int, float]]:
    acc = event_accumulator.EventAccumulator(str(log_dir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def _train(cfg, run_dir, devices):
    from lcx.training.loop import train

    # optax's Adam bias correction computes `float ** int32 step` (see test_training.py)
    with jax.numpy_dtype_promotion("standard"):
        return train(run_config(cfg), run_dir, devices)


SMALL = ("model=tiny", "model.n_layers=1", "train.seq_len=256", "train.global_batch=2", "train.warmup_steps=1")


def test_events_match_metrics_jsonl(tmp_path, devices):
    cfg = _config(*SMALL, "train.steps=4", "train.eval_every=2", "train.eval_batches=1")
    _train(cfg, tmp_path, devices)
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    scalars = _scalars(tmp_path / "tensorboard")
    expected: dict[str, dict[int, float]] = {}
    for r in records:
        for k, v in r.items():
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool):
                expected.setdefault(tensorboard_tag(k), {})[r["step"]] = float(np.float32(v))
    assert set(scalars) == set(expected)
    for tag in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_sec", "train/mfu", "val/loss"):
        assert tag in scalars, tag
    assert "train/temp_bytes_per_device" in scalars and "train/step_time_s" in scalars
    assert sorted(scalars["train/loss"]) == [1, 2, 3, 4] and sorted(scalars["val/loss"]) == [2, 4]
    for tag, by_step in expected.items():
        assert scalars[tag] == pytest.approx(by_step, rel=0, abs=0), tag


def test_tensorboard_off_writes_no_events(tmp_path, devices):
    _train(_config(*SMALL, "train.steps=1", "train.eval_every=0", "train.tensorboard=false"), tmp_path, devices)
    assert (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "tensorboard").exists()


def test_resume_purges_the_interrupted_runs_later_steps(tmp_path, devices):
    """Steps 1-3 logged, checkpoint at 2; the resumed run rewrites 3-4: TensorBoard shows each
    step once, with the resumed run's values, like metrics.jsonl."""
    run_dir, ckpt = tmp_path / "run", tmp_path / "ckpt"
    common = (
        *SMALL,
        "train.eval_every=0",
        f"checkpoint.dir={ckpt}",
        "checkpoint.every=2",
        "checkpoint.async_save=false",
    )
    _train(_config(*common, "train.steps=3"), run_dir, devices)
    # the run's last-step checkpoint at 3 is what a crash would lose: drop it
    import shutil

    shutil.rmtree(ckpt / "3")
    _train(_config(*common, "train.steps=4"), run_dir, devices)
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    loss = _scalars(run_dir / "tensorboard")["train/loss"]
    assert sorted(loss) == [1, 2, 3, 4]
    assert loss == pytest.approx({r["step"]: float(np.float32(r["loss"])) for r in records}, rel=0, abs=0)
