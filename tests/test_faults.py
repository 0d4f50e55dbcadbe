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

ROOT = pathlib.Path(__file__).resolve().parent.parent
# the smallest real run: one layer, generated data, 256 tokens, no evaluation
FAST = ["model=tiny", "model.n_layers=1", "data=passkey", "train.seq_len=256", "train.global_batch=2",
        "train.eval_every=0", "train.warmup_steps=0"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("xla_cache")
    e = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(cache),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    e.pop("XLA_FLAGS", None)
    return e


def _cli(args, cwd, env, module="lcx.train") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait(p: subprocess.Popen, timeout=300) -> tuple[int, str]:
    _, err = p.communicate(timeout=timeout)
    return p.returncode, err


def _steps(run_dir: pathlib.Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


# -- 1. run directories ---------------------------------------------------------------------------


@pytest.mark.slow
def test_concurrent_launches_get_their_own_run_dirs_and_nothing_is_overwritten(tmp_path, env):
    # issue 17: two runs started in the same second shared one directory and interleaved their
    # metrics; a later run in that directory replaced the first one's metrics.jsonl
    procs = [_cli([*FAST, "train.steps=2", f"train.seed={s}"], tmp_path, env) for s in (1, 2)]
    for p in procs:
        rc, err = _wait(p)
        assert rc == 0, err[-3000:]
    runs = sorted(p.parent for p in (tmp_path / "outputs").rglob("metrics.jsonl"))
    assert len(runs) == 2, runs
    seeds = set()
    for d in runs:
        assert _steps(d) == [1, 2]
        info = json.loads((d / "run_info.json").read_text())
        overrides = yaml.safe_load((d / ".hydra" / "overrides.yaml").read_text())
        seed = info["config"]["train"]["seed"]
        assert f"train.seed={seed}" in overrides  # run_info.json and .hydra agree
        seeds.add(seed)
    assert seeds == {1, 2}

    first = runs[0]
    before = (first / "metrics.jsonl").read_text()
    rc, err = _wait(_cli([*FAST, "train.steps=1", f"hydra.run.dir={first}"], tmp_path, env))
    assert rc == 2 and "already holds another run's metrics.jsonl" in err and "train.reuse_run_dir=true" in err, err
    assert (first / "metrics.jsonl").read_text() == before  # untouched


def test_claim_run_dir_refuses_another_runs_metrics(tmp_path):
    from lcx.training.loop import RunDirInUseError, claim_run_dir

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


# -- 2. sweeps and resumes ------------------------------------------------------------------------


@pytest.mark.slow
def test_sweep_jobs_get_their_own_checkpoints_and_a_changed_resume_is_refused(tmp_path, env):
    # issue 17: job 1 resumed job 0's final checkpoint, logged "nothing to train", wrote no metrics
    sweep = tmp_path / "mr"
    rc, err = _wait(_cli(["-m", *FAST, "train.lr=3e-3,1e-3", "checkpoint.dir=ckpt", "train.steps=2",
                          f"hydra.sweep.dir={sweep}"], tmp_path, env))
    assert rc == 0, err[-3000:]
    jobs = sorted(p.parent for p in sweep.rglob("metrics.jsonl"))
    assert len(jobs) == 2, jobs
    for d in jobs:
        assert _steps(d) == [1, 2]  # every sweep point has its result
        assert (d / "ckpt" / "2").is_dir() and json.loads((d / "run_info.json").read_text())["checkpoint_dir"] == str(
            d / "ckpt")
    assert not (tmp_path / "ckpt").exists()
    # resuming job 0's checkpoint with another learning rate: refused, naming the key, before compiling
    ck = jobs[0] / "ckpt"
    # (quoted: the job directory's name holds '=')
    rc, err = _wait(_cli([*FAST, "train.lr=5e-3", "train.steps=3", f"checkpoint.dir='{ck}'",
                          f"hydra.run.dir={tmp_path / 'resume'}"], tmp_path, env))
    assert rc == 2 and "train.lr: 0.003 -> 0.005" in err and "checkpoint.allow_config_change=true" in err, err[-3000:]
    assert sorted(p.name for p in ck.iterdir() if p.name.isdigit()) == ["2"]  # nothing written or set aside


def _meta(step=4, **train):
    t = {"steps": 4, "lr": 3e-3, "seed": 0, "seq_len": 256, "log_every": 1, "schedule_start": None, **train}
    return {"step": step, "config": {"model": {"name": "tiny"}, "train": t, "data": {"name": "passkey", "digits": 5}}}


def test_config_changes_name_every_training_key_and_allow_extensions():
    from lcx.training.checkpoint import config_changes

    saved = _meta()["config"]
    now = lambda **t: {**saved, "train": {**saved["train"], **t}}  # noqa: E731
    assert config_changes(saved, now(steps=10, log_every=5), 4) == []  # an extension; logging is free
    assert config_changes(saved, now(steps=2), 4) == []  # at or below the checkpoint: nothing trains
    assert config_changes(saved, now(steps=3), 2) == ["train.steps: 4 -> 3"]
    assert config_changes(saved, now(lr=1e-3, seed=1), 4) == ["train.lr: 0.003 -> 0.001", "train.seed: 0 -> 1"]
    assert config_changes(saved, {**saved, "data": {"name": "passkey", "digits": 7}}, 4) == ["data.digits: 5 -> 7"]
    # a length-extension stage starting at the checkpoint's step changes its own keys on purpose
    assert config_changes(saved, now(seq_len=512, lr=1e-3, steps=8, schedule_start=4), 4) == []
    assert config_changes(saved, now(seq_len=512, schedule_start=4), 6) == ["train.schedule_start: None -> 4",
                                                                            "train.seq_len: 256 -> 512"]


def test_check_resumable_refuses_changes_and_shared_sweep_dirs(caplog):
    from lcx.training.checkpoint import CheckpointConfigChangedError, CheckpointMismatchError, check_resumable

    meta, cfg = _meta(), _meta(lr=1e-3)["config"]
    with pytest.raises(CheckpointConfigChangedError, match=r"train.lr: 0.003 -> 0.001.*allow_config_change=true"):
        check_resumable(meta, cfg, where="ck/4", allow=False)
    check_resumable(meta, cfg, where="ck/4", allow=True)
    assert "train.lr: 0.003 -> 0.001" in caplog.text
    job = {"sweep_dir": "/s", "job": 1, "output_dir": "/s/1"}
    with pytest.raises(CheckpointMismatchError, match="written by job 0 of this sweep"):
        check_resumable({**meta, "sweep": {**job, "job": 0}}, meta["config"], where="ck/4", allow=True, job=job)
    check_resumable({**meta, "sweep": job}, meta["config"], where="ck/4", allow=False, job=job)
