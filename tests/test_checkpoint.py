"""Checkpoints: exact resume after SIGKILL (mid-run and mid-save), SIGTERM/SIGINT final saves,
resharding onto other plans, corrupt and partial checkpoints, model mismatches, non-finite values.

Training runs are real ``python -m lcx.train`` subprocesses killed with real signals; they share
one tiny configuration (ring attention on 8 simulated devices) and a persistent XLA compilation
cache, so each compiles once. The uninterrupted reference run is made once per module.
"""

import json
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from hydra import compose, initialize_config_module

from lcx.config import run_config
from lcx.config.run import checkpoint_config
from lcx.sharding import bind
from lcx.sharding.config import preset
from lcx.training.checkpoint import CORRUPT_DIR, Checkpoints
from lcx.training.resume import (
    CheckpointMismatchError,
    check_compatible,
    load_model,
    train_state_target,
)

STEPS = 14
EVERY = 4
ARGS = [
    "plan=ring",
    "model=tiny",
    "train.seq_len=128",
    "train.global_batch=4",
    f"train.steps={STEPS}",
    "train.warmup_steps=2",
    "train.eval_every=0",
    f"checkpoint.every={EVERY}",
    "checkpoint.keep=2",
]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Subprocess environment: CPU only, one compilation cache shared by all runs."""
    cache = tmp_path_factory.mktemp("xla_cache")
    e = dict(os.environ)
    e.update(
        JAX_PLATFORMS="cpu",
        JAX_COMPILATION_CACHE_DIR=str(cache),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    return e


def _start(run_dir: pathlib.Path, ckpt: pathlib.Path, env, *extra) -> subprocess.Popen:
    run_dir.mkdir(parents=True, exist_ok=True)
    log = (run_dir / "log.txt").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "lcx.train", *ARGS, f"checkpoint.dir={ckpt}", f"hydra.run.dir={run_dir}", *extra],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )


def _finish(p: subprocess.Popen, run_dir: pathlib.Path, timeout=240) -> int:
    try:
        return p.wait(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()


def _log(run_dir) -> str:
    return (run_dir / "log.txt").read_text(errors="replace")


def _metrics(run_dir) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written right now
            break
    return out


def _last_step(run_dir) -> int:
    m = _metrics(run_dir)
    return m[-1]["step"] if m else 0


def _complete(ckpt: pathlib.Path) -> list[int]:
    return sorted(int(p.name) for p in ckpt.glob("*") if p.name.isdigit()) if ckpt.exists() else []


def _saving(ckpt: pathlib.Path) -> bool:
    return ckpt.exists() and any(".orbax-checkpoint-tmp" in p.name for p in ckpt.iterdir())


def _wait_for(p, cond, what, timeout=180):
    t0 = time.time()
    while not cond():
        if p.poll() is not None:
            raise AssertionError(f"training exited (rc={p.returncode}) before {what}")
        if time.time() - t0 > timeout:
            p.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, env):
    """One uninterrupted run: metrics and checkpoints (steps 12 and 14 kept)."""
    root = tmp_path_factory.mktemp("reference")
    p = _start(root / "run", root / "ckpt", env)
    assert _finish(p, root / "run") == 0, _log(root / "run")[-3000:]
    return {"run": root / "run", "ckpt": root / "ckpt", "metrics": _metrics(root / "run")}


def _state(ckpt, step, mp):
    c = Checkpoints(ckpt, read_only=True)
    try:
        target, _ = train_state_target(c.read_meta(step)["config"], mp)
        return c.restore(step, target)
    finally:
        c.close()


def _assert_trees_equal(a, b):
    """Same structure (for a TrainState: also its step and data position) and bitwise-equal
    leaves (a PRNG key: its key data)."""
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _assert_same_run(metrics, ref):
    """Every step logged exactly once, with the reference's loss and learning rate, bit for bit."""
    assert [r["step"] for r in metrics] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in metrics] == [r["loss"] for r in ref]
    assert [r["lr"] for r in metrics] == [r["lr"] for r in ref]
    assert [r["grad_norm"] for r in metrics] == [r["grad_norm"] for r in ref]


@pytest.mark.slow
def test_reference_run_saves_every_n_steps_and_at_the_end(reference, devices):
    assert _complete(reference["ckpt"]) == [12, STEPS]  # 4, 8 deleted by keep=2
    meta = Checkpoints(reference["ckpt"], read_only=True).read_meta(STEPS)
    assert meta["step"] == STEPS and meta["loss"] == reference["metrics"][-1]["loss"]
    assert (meta["data"]["epoch"], meta["data"]["row"]) == (0, STEPS * 4)  # rows consumed (batch 4)
    assert meta["config"]["plan"]["name"] == "ring" and meta["config"]["train"]["steps"] == STEPS
    assert set(meta["rng"]) == {"impl", "data"}


@pytest.mark.slow
def test_sigkill_mid_run_resumes_to_the_uninterrupted_result(tmp_path, reference, env, devices):
    """SIGKILL as soon as a save is in flight after a complete checkpoint exists (or at step 10
    if no save is caught in the act), restart, and finish: same losses, same parameters,
    same optimizer state as the uninterrupted run, bit for bit."""
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    p = _start(run, ckpt, env)
    _wait_for(p, lambda: _complete(ckpt) and (_saving(ckpt) or _last_step(run) >= 10), "a checkpoint")
    saving = _saving(ckpt)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    killed_at = _last_step(run)
    assert 0 < killed_at < STEPS, killed_at
    before = _complete(ckpt)
    print(f"SIGKILL after step {killed_at}, complete checkpoints {before}, save in flight: {saving}")

    p = _start(run, ckpt, env)
    assert _finish(p, run) == 0, _log(run)[-3000:]
    metrics = _metrics(run)
    _assert_same_run(metrics, reference["metrics"])
    resumed = [r for r in metrics if "resumed_from" in r]
    assert len(resumed) == 1 and resumed[0]["resumed_from"] == max(before), (resumed, before)
    assert not _saving(ckpt)  # the interrupted save's temporary directory was cleaned up

    mp = bind(preset("ring"), devices)
    a, b = _state(reference["ckpt"], STEPS, mp), _state(ckpt, STEPS, mp)
    _assert_trees_equal(a.state, b.state)
    assert a.meta["data"] == b.meta["data"] and a.meta["rng"] == b.meta["rng"]


@pytest.mark.slow
def test_sigterm_and_sigint_save_before_exit_and_resume_exactly(tmp_path, reference, env):
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    p = _start(run, ckpt, env)
    _wait_for(p, lambda: _last_step(run) >= 2, "step 2")
    os.kill(p.pid, signal.SIGTERM)
    assert _finish(p, run) == 128 + signal.SIGTERM, _log(run)[-3000:]
    s1 = _last_step(run)
    assert s1 < STEPS and _complete(ckpt)[-1] == s1, (s1, _complete(ckpt))
    assert "SIGTERM" in _log(run)

    p = _start(run, ckpt, env)
    _wait_for(p, lambda: _last_step(run) >= s1 + 2, f"step {s1 + 2}")
    os.kill(p.pid, signal.SIGINT)
    assert _finish(p, run) == 128 + signal.SIGINT, _log(run)[-3000:]
    s2 = _last_step(run)
    assert s1 < s2 < STEPS and _complete(ckpt)[-1] == s2, (s1, s2, _complete(ckpt))

    p = _start(run, ckpt, env)
    assert _finish(p, run) == 0, _log(run)[-3000:]
    _assert_same_run(_metrics(run), reference["metrics"])
    assert [r["resumed_from"] for r in _metrics(run) if "resumed_from" in r] == [s1, s2]


@pytest.mark.slow
def test_resume_with_no_steps_left_says_so_and_prints_no_loss(tmp_path, reference, env):
    """Rerunning a finished run: nothing is trained, and the last line says so instead of
    printing the checkpoint's loss as the run's "final train loss"."""
    ckpt, run = tmp_path / "ckpt", tmp_path / "run"
    shutil.copytree(reference["ckpt"], ckpt)
    p = _start(run, ckpt, env)
    assert _finish(p, run) == 0, _log(run)[-3000:]
    out = _log(run)
    assert f"checkpoint at step {STEPS} already reached train.steps={STEPS}; nothing to train" in out, out[-3000:]
    assert "final train loss" not in out
    assert _metrics(run) == []  # no step ran, nothing logged


def test_done_message_prints_only_losses_this_run_computed():
    from lcx.reports.train import done_message
    from lcx.training.state import TrainResult, TrainState

    state = TrainState(params={}, opt_state=None)
    out = TrainResult([], None, 2.5, state, None, run_dir="r", compile_s=None, start_step=14)
    msg = done_message(out, 10)
    assert "checkpoint at step 14 already reached train.steps=10; nothing to train" in msg
    assert "loss" not in msg.replace("nothing to train", "")
    out = TrainResult([3.0, 2.0], 2.0, None, state, None, run_dir="r", compile_s=1.0, start_step=0)
    assert done_message(out, 2).startswith("done: final train loss 2.0000 nats/token; run directory r")


@pytest.mark.slow
@pytest.mark.parametrize(
    "plan,mesh",
    [
        ("usp", {"data": 1, "ulysses": 2, "ring": 4}),
        ("fsdp", {"fsdp": 8}),
        ("dp", {"data": 1}),  # one device
    ],
)
def test_restore_under_another_plan_gives_identical_state(reference, devices, plan, mesh):
    """Written under ring on 8 devices; read under USP 2x4, FSDP 8 and one device."""
    src = _state(reference["ckpt"], STEPS, bind(preset("ring"), devices))
    p = preset(plan).with_mesh(**mesh)
    n = int(np.prod(list(mesh.values())))
    mp = bind(p, devices[:n])
    dst = _state(reference["ckpt"], STEPS, mp)
    _assert_trees_equal(src.state.arrays(), dst.state.arrays())
    target, _ = train_state_target(src.meta["config"], mp)
    for x, t in zip(jax.tree.leaves(dst.state.arrays()), jax.tree.leaves(target.arrays()), strict=True):
        assert x.sharding == t.sharding
    if plan == "fsdp":  # really sharded, not replicated
        emb = dst.state.params.embed.weight
        assert len({str(s.index) for s in emb.addressable_shards}) == 8
    model, meta = load_model(reference["ckpt"], mp)
    assert meta["step"] == STEPS
    _assert_trees_equal(jax.tree.leaves(model), jax.tree.leaves(dst.state.params))


def _corrupt_arrays(step_dir: pathlib.Path):
    for f in (step_dir / "state").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(b"\0garbage" * 16)


@pytest.mark.slow
def test_corrupt_and_partial_checkpoints_fall_back_to_the_previous_one(tmp_path, reference, devices, caplog):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference["ckpt"], ckpt)
    # what a SIGKILL during a save leaves behind: a temporary directory with part of a step
    shutil.copytree(ckpt / str(STEPS), ckpt / f"{STEPS + 4}.orbax-checkpoint-tmp")
    # a step directory that lost its array files (non-atomic filesystem, disk trouble)
    shutil.copytree(ckpt / str(STEPS), ckpt / str(STEPS + 2))
    shutil.rmtree(ckpt / str(STEPS + 2) / "state" / "ocdbt.process_0")
    (ckpt / str(STEPS + 2) / "meta" / "metadata").write_text(
        (ckpt / str(STEPS) / "meta" / "metadata").read_text().replace(f'"step": {STEPS}', f'"step": {STEPS + 2}')
    )
    _corrupt_arrays(ckpt / str(STEPS))  # the newest real one: arrays overwritten with garbage
    mp = bind(preset("ring"), devices)

    with caplog.at_level(logging.WARNING):
        c = Checkpoints(ckpt, keep=2)
        assert not _saving(ckpt)  # the interrupted save is cleaned up, never restored
        target, _ = train_state_target(c.read_meta(12)["config"], mp)
        r = c.restore_latest(target)
        c.close()
    assert r.step == 12
    text = caplog.text
    assert f"step {STEPS + 2}" in text and f"step {STEPS}" in text and "unreadable" in text
    assert _complete(ckpt) == [12]
    assert len(list((ckpt / CORRUPT_DIR).iterdir())) == 2
    _assert_trees_equal(r.state.arrays(), _state(reference["ckpt"], 12, mp).state.arrays())

    # a broken meta item (bad JSON) is unreadable too; with nothing left, the error says so
    (ckpt / "12" / "meta" / "metadata").write_text("{not json")
    c = Checkpoints(ckpt, keep=2)
    with pytest.raises(RuntimeError, match="no checkpoint in .* could be read"):
        c.restore_latest(target)
    c.close()


def _config(*overrides):
    with initialize_config_module(config_module="lcx.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.slow
def test_incompatible_model_is_refused_naming_the_field(tmp_path, reference, devices):
    from lcx.training.loop import train

    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference["ckpt"], ckpt)
    cfg = _config(*ARGS, "model.d_model=64", f"checkpoint.dir={ckpt}")
    with pytest.raises(CheckpointMismatchError, match=r"model\.d_model=128 but this run has model\.d_model=64"):
        train(run_config(cfg), tmp_path / "run", devices)
    assert _complete(ckpt) == [12, STEPS]  # nothing set aside: a refusal is not corruption
    meta = Checkpoints(ckpt, read_only=True).read_meta(STEPS)
    check_compatible(meta, dict(meta["config"]["model"], remat="full"), where="x")  # remat may change


@pytest.mark.slow
def test_nonfinite_loss_stops_with_diagnostic_and_no_poisoned_checkpoint(tmp_path, devices):
    from lcx.training.loop import train

    ckpt = tmp_path / "ckpt"
    cfg = _config(
        *ARGS, "train.steps=4", "train.lr=1e30", "train.warmup_steps=0", "checkpoint.every=1", f"checkpoint.dir={ckpt}"
    )
    with jax.numpy_dtype_promotion("standard"), pytest.raises(FloatingPointError) as e:
        train(run_config(cfg), tmp_path / "run", devices)
    msg = str(e.value)
    print(msg)
    # lr=1e30: step 1 is fine, step 2's gradient overflows (its loss may still be finite)
    assert "non-finite" in msg and "at step 2 " in msg and "Lower train.lr" in msg, msg
    assert "['opt_state']" in msg or "['params']" in msg  # names the tensors
    assert "the last checkpoint is step 1" in msg
    assert _complete(ckpt) == [1]  # step 1 kept, nothing from step 2 on
    meta = Checkpoints(ckpt, read_only=True).read_meta(1)
    assert np.isfinite(meta["loss"])


@pytest.mark.slow
def test_save_refuses_nonfinite_tensors(tmp_path, reference, devices):
    mp = bind(preset("ring"), devices)
    r = _state(reference["ckpt"], STEPS, mp)
    params = r.state.params
    import equinox as eqx

    poisoned = eqx.tree_at(lambda p: p.final_norm.weight, params, params.final_norm.weight * np.float32(np.nan))
    c = Checkpoints(tmp_path / "ckpt")
    with pytest.raises(FloatingPointError, match=r"refusing to checkpoint step 3: non-finite values in .*final_norm"):
        c.save(r.state.replace(params=poisoned, step=3), r.meta)
    c.close()
    assert _complete(tmp_path / "ckpt") == []


def test_checkpoint_config_resolves_relative_dirs_against_the_launch_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    full = {
        "dir": "ck",
        "every": 5,
        "keep": 2,
        "async_save": True,
        "allow_config_change": False,
        "on_save_error": "stop",
    }
    assert checkpoint_config(None).dir is None and not checkpoint_config({**full, "dir": None}).enabled
    c = checkpoint_config(full)
    assert c.dir == tmp_path / "ck" and c.due(10) and not c.due(11)
    with pytest.raises(ValueError, match="checkpoint.keep must be >= 1"):
        checkpoint_config({**full, "keep": 0})
    # no defaults in code (config.yaml holds them): a partial section is refused, naming the key
    with pytest.raises(ValueError, match="checkpoint.async_save is missing"):
        checkpoint_config({"dir": "ck", "every": 5, "keep": 2})
