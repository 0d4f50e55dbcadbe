"""Fault injection, end to end (issue 17): nothing a run wrote is lost, nothing asked is ignored.

1. Two runs launched at once get two run directories; a run pointed at another run's directory
   is refused (or, by opt-in, keeps that run's files renamed).
2. A sweep with a relative checkpoint.dir gets one checkpoint directory per job; a resume whose
   training config differs is refused naming the keys.
3. A save that fails on a full disk (a real tmpfs) is never listed or restored, is raised naming
   the step, keeps older checkpoints, and can be saved again.
4. Misspelt keys: tests/test_config_schema.py (through the CLI as well).
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from lcx.config import run_config

ROOT = pathlib.Path(__file__).resolve().parent.parent
# the smallest real run: one layer, generated data, 256 tokens, no evaluation
FAST = [
    "model=tiny",
    "model.n_layers=1",
    "data=passkey",
    "train.seq_len=256",
    "train.global_batch=2",
    "train.eval_every=0",
    "train.warmup_steps=0",
]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("xla_cache")
    e = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        JAX_COMPILATION_CACHE_DIR=str(cache),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    e.pop("XLA_FLAGS", None)
    return e


def _cli(args, cwd, env, module="lcx.train") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait(p: subprocess.Popen, timeout=300) -> tuple[int, str]:
    _, err = p.communicate(timeout=timeout)
    return p.returncode, err


def _steps(run_dir: pathlib.Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


# -- 1 and 2. run directories and sweeps, end to end ---------------------------------------------


@pytest.mark.slow
def test_concurrent_runs_and_a_sweep_lose_nothing(tmp_path, env):
    """Issue 17, scenarios 1 and 2 through the real CLI, all launched at once: two runs started
    in the same second shared one directory (interleaved metrics.jsonl; run_info.json disagreed
    with .hydra/overrides.yaml), and the two jobs of a sweep with checkpoint.dir=ckpt shared one
    checkpoint directory (job 1 resumed job 0's final checkpoint and wrote no metrics)."""
    sweep = tmp_path / "mr"
    procs = [_cli([*FAST, "train.steps=2", f"train.seed={s}"], tmp_path, env) for s in (1, 2)]
    procs.append(
        _cli(
            ["-m", *FAST, "train.lr=3e-3,1e-3", "checkpoint.dir=ckpt", "train.steps=2", f"hydra.sweep.dir={sweep}"],
            tmp_path,
            env,
        )
    )
    for p in procs:
        rc, err = _wait(p)
        assert rc == 0, err[-3000:]
    runs = sorted(p.parent for p in (tmp_path / "outputs").rglob("metrics.jsonl"))
    assert len(runs) == 2, runs
    seeds = set()
    for d in runs:
        assert _steps(d) == [1, 2]
        info = json.loads((d / "run_info.json").read_text())
        seed = info["config"]["train"]["seed"]
        assert f"train.seed={seed}" in yaml.safe_load((d / ".hydra" / "overrides.yaml").read_text())  # they agree
        seeds.add(seed)
    assert seeds == {1, 2}
    jobs = sorted(p.parent for p in sweep.rglob("metrics.jsonl"))
    assert len(jobs) == 2, jobs
    for d in jobs:
        assert _steps(d) == [1, 2]  # every sweep point has its result, from its own checkpoints
        assert (d / "ckpt" / "2").is_dir()
        assert json.loads((d / "run_info.json").read_text())["checkpoint_dir"] == str(d / "ckpt")
    assert not (tmp_path / "ckpt").exists()

    # refused, both before compiling: another run's directory, and job 0's checkpoint resumed
    # with another learning rate (quoted: the job directory's name holds '=')
    first, before, ck = runs[0], (runs[0] / "metrics.jsonl").read_text(), jobs[0] / "ckpt"
    refused = [
        _cli([*FAST, "train.steps=1", f"hydra.run.dir={first}"], tmp_path, env),
        _cli(
            [*FAST, "train.lr=5e-3", "train.steps=3", f"checkpoint.dir='{ck}'", f"hydra.run.dir={tmp_path / 'resume'}"],
            tmp_path,
            env,
        ),
    ]
    (rc1, err1), (rc2, err2) = (_wait(p) for p in refused)
    assert rc1 == 2 and "already holds another run's metrics.jsonl" in err1 and "train.reuse_run_dir=true" in err1, err1
    assert (first / "metrics.jsonl").read_text() == before  # untouched
    assert rc2 == 2 and "train.lr: 0.003 -> 0.005" in err2 and "checkpoint.allow_config_change=true" in err2, err2
    assert sorted(p.name for p in ck.iterdir() if p.name.isdigit()) == ["2"]  # nothing written or set aside


def test_claim_run_dir_refuses_another_runs_metrics(tmp_path):
    from lcx.training.rundir import RunDirInUseError, claim_run_dir

    d = tmp_path / "run"
    d.mkdir()
    claim_run_dir(d, ckpt_dir=None, reuse=False)  # claims it: an empty metrics.jsonl, exclusively
    assert (d / "metrics.jsonl").read_text() == ""
    with pytest.raises(RunDirInUseError, match="already holds another run's metrics.jsonl"):
        claim_run_dir(d, ckpt_dir=None, reuse=False)
    # the checkpoint-resume path: run_info.json names this run's checkpoint.dir
    (d / "run_info.json").write_text(json.dumps({"checkpoint_dir": str(tmp_path / "ck")}))
    claim_run_dir(d, ckpt_dir=tmp_path / "ck", reuse=False)
    with pytest.raises(RunDirInUseError):
        claim_run_dir(d, ckpt_dir=tmp_path / "other", reuse=False)
    # train.reuse_run_dir=true: the other run's files are kept, renamed; a new metrics.jsonl starts
    (d / "metrics.jsonl").write_text('{"step": 1}\n')
    claim_run_dir(d, ckpt_dir=tmp_path / "other", reuse=True)
    kept = sorted(d.glob("metrics.*.jsonl"))
    assert len(kept) == 1 and kept[0].read_text() == '{"step": 1}\n' and (d / "metrics.jsonl").read_text() == ""
    assert len(list(d.glob("run_info.*.json"))) == 1 and not (d / "run_info.json").exists()


# -- 2. resumes of a changed config ------------------------------------------------------------


def _meta(step=4, **train):
    t = {"steps": 4, "lr": 3e-3, "seed": 0, "seq_len": 256, "log_every": 1, "schedule_start": None, **train}
    return {"step": step, "config": {"model": {"name": "tiny"}, "train": t, "data": {"name": "passkey", "digits": 5}}}


def test_config_changes_name_every_training_key_and_allow_extensions():
    from lcx.training.resume import config_changes

    saved = _meta()["config"]
    now = lambda **t: {**saved, "train": {**saved["train"], **t}}  # noqa: E731
    assert config_changes(saved, now(steps=10, log_every=5), 4) == []  # an extension; logging is free
    assert config_changes(saved, now(steps=2), 4) == []  # at or below the checkpoint: nothing trains
    assert config_changes(saved, now(steps=3), 2) == ["train.steps: 4 -> 3"]
    assert config_changes(saved, now(lr=1e-3, seed=1), 4) == ["train.lr: 0.003 -> 0.001", "train.seed: 0 -> 1"]
    assert config_changes(saved, {**saved, "data": {"name": "passkey", "digits": 7}}, 4) == ["data.digits: 5 -> 7"]
    # a length-extension stage starting at the checkpoint's step changes its own keys on purpose
    assert config_changes(saved, now(seq_len=512, lr=1e-3, steps=8, schedule_start=4), 4) == []
    assert config_changes(saved, now(seq_len=512, schedule_start=4), 6) == [
        "train.schedule_start: None -> 4",
        "train.seq_len: 256 -> 512",
    ]


def test_check_resumable_refuses_changes_and_shared_sweep_dirs(caplog):
    from lcx.training.resume import CheckpointConfigChangedError, CheckpointMismatchError, check_resumable

    meta, cfg = _meta(), _meta(lr=1e-3)["config"]
    with pytest.raises(CheckpointConfigChangedError, match=r"train.lr: 0.003 -> 0.001.*allow_config_change=true"):
        check_resumable(meta, cfg, where="ck/4", allow=False)
    check_resumable(meta, cfg, where="ck/4", allow=True)
    assert "train.lr: 0.003 -> 0.001" in caplog.text
    job = {"sweep_dir": "/s", "job": 1, "output_dir": "/s/1"}
    with pytest.raises(CheckpointMismatchError, match="written by job 0 of this sweep"):
        check_resumable({**meta, "sweep": {**job, "job": 0}}, meta["config"], where="ck/4", allow=True, job=job)
    check_resumable({**meta, "sweep": job}, meta["config"], where="ck/4", allow=False, job=job)


# -- 3. failed saves on a real full disk ----------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A function mounting a tmpfs of ``size`` bytes (root only; skipped where mounting is not
    permitted); unmounted afterwards."""
    mounts = []

    def mount(size: int) -> pathlib.Path:
        if os.geteuid() != 0:
            pytest.skip("a full-disk test mounts a tmpfs, which needs root")
        mnt = tmp_path / f"disk{len(mounts)}"
        mnt.mkdir()
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True, text=True
        )
        if r.returncode:
            pytest.skip(f"mounting a tmpfs is not permitted here: {r.stderr.strip()}")
        mounts.append(mnt)
        return mnt

    yield mount
    for m in mounts:
        subprocess.run(["umount", "-l", str(m)], capture_output=True)


def _tmp_dirs(d: pathlib.Path) -> list[str]:
    return [p.name for p in d.iterdir() if "tmp" in p.name]


def test_a_save_that_fills_the_disk_is_never_listed_and_can_be_retried(small_disk):
    import jax
    import jax.numpy as jnp

    from lcx.training.checkpoint import Checkpoints, CheckpointSaveError
    from lcx.training.state import TrainState

    ck = small_disk(600 << 10) / "ck"  # 600 KiB: the small state fits, the 1.6 MB one does not
    small = {"w": jnp.arange(16.0)}
    big = {"w": jax.random.normal(jax.random.key(0), (400_000,))}  # random: does not compress
    c = Checkpoints(ck, keep=3, async_save=True)
    try:
        c.save(TrainState(params=small, opt_state={}, step=1), {"loss": 1.0})
        c.wait()
        assert c.steps() == [1]
        assert c.save(
            TrainState(params=big, opt_state={}, step=2), {"loss": 2.0}
        )  # returns at once; the write fails in the background
        assert c.steps() == [1] and c.latest_step() == 1  # in flight or failed: never listed
        with pytest.raises(
            CheckpointSaveError,
            match=r"checkpoint of step 2 .*failed.*No space left on device.*"
            r"the checkpoints kept are steps \[1\]",
        ):
            c.check(wait=True)
        assert c.steps() == [1] and _tmp_dirs(ck) == []  # the partial step's files are gone
        # a good older checkpoint is what a resume gets
        r = c.restore_latest(TrainState(params={"w": jax.ShapeDtypeStruct((16,), jnp.float32)}, opt_state={}))
        assert r.step == 1 and r.state.step == 1 and float(r.state.params["w"][3]) == 3.0
        assert c.save(
            TrainState(params=small, opt_state={}, step=2), {"loss": 2.0}
        )  # the failed step can be saved again (was "already saved")
        c.wait()
        assert c.steps() == [1, 2]
        # a failure found by the next save is raised there, naming its own step, once
        c.save(TrainState(params=big, opt_state={}, step=3), {})
        with pytest.raises(CheckpointSaveError, match="checkpoint of step 3 "):
            c.save(TrainState(params=small, opt_state={}, step=4), {})
        assert c.save(TrainState(params=small, opt_state={}, step=4), {})
        c.wait()
        assert c.steps() == [1, 2, 4]
    finally:
        c.close()
    # a synchronous save fails at once, the same way
    c = Checkpoints(ck, keep=3, async_save=False)
    try:
        with pytest.raises(CheckpointSaveError, match="checkpoint of step 5 .*No space left on device"):
            c.save(TrainState(params=big, opt_state={}, step=5), {})
        assert c.steps() == [1, 2, 4] and _tmp_dirs(ck) == []
    finally:
        c.close()


@pytest.mark.slow
def test_training_stops_at_the_step_after_a_failed_save(tmp_path, small_disk, devices):
    import jax
    from hydra import compose, initialize_config_module

    from lcx.training.checkpoint import Checkpoints, CheckpointSaveError
    from lcx.training.loop import train

    with initialize_config_module("lcx.conf", version_base="1.3"):
        c = compose(
            "config",
            overrides=[
                *FAST,
                "train.steps=3",
                "checkpoint.every=1",
                "checkpoint.keep=3",
                f"checkpoint.dir={tmp_path / 'disk0' / 'ck'}",
            ],
        )
    # room for one checkpoint (float32 parameters and AdamW's two moments, plus orbax's metadata)
    # and a half: step 1 fits, step 2 (written while step 1 is kept) does not
    n = run_config(c).model.n_params
    ck = small_disk(int(1.5 * (3 * 4 * n + (64 << 10))) // 4096 * 4096) / "ck"
    with (
        jax.numpy_dtype_promotion("standard"),
        pytest.raises(  # as the CLI runs (the suite is strict)
            CheckpointSaveError, match=r"checkpoint of step 2 .*No space left on device"
        ),
    ):
        train(run_config(c), tmp_path / "run", devices)
    assert _steps(tmp_path / "run") == [1, 2, 3]  # raised during step 3, the step after the save
    r = Checkpoints(ck, read_only=True)
    assert r.steps() == [1] and _tmp_dirs(ck) == []  # the good step 1 is kept, nothing partial
    r.close()
