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
