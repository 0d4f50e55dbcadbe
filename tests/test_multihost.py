"""Multi-host on JAX's own runtime: two processes with 4 CPU devices each, over loopback, train
one step whose loss equals the single-process 8-device value."""

import json
import os
import socket
import subprocess
import sys

import pytest

# two real processes: the floor stack (-m 'not slow') skips them
pytestmark = pytest.mark.slow

COMMON = [
    "model=tiny",
    "plan=ring",
    "train.steps=2",
    "train.seq_len=256",
    "train.global_batch=2",
    "train.eval_every=0",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _losses(run_dir) -> list[float]:
    return [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_two_processes_match_one_process(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    single = tmp_path / "single"
    r = subprocess.run(
        [sys.executable, "-m", "lcx.train", *COMMON, f"hydra.run.dir={single}"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]

    port = _free_port()
    procs = []
    for pid in range(2):
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "lcx.train",
                    *COMMON,
                    "hardware.cpu_devices=4",
                    f"distributed.coordinator_address=127.0.0.1:{port}",
                    "distributed.num_processes=2",
                    f"distributed.process_id={pid}",
                    f"hydra.run.dir={tmp_path / f'proc{pid}'}",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    info = json.loads((tmp_path / "proc0" / "run_info.json").read_text())
    assert info["device_count"] == 8 and info["process_count"] == 2
    ref = _losses(single)
    for pid in range(2):
        got = _losses(tmp_path / f"proc{pid}")
        assert len(got) == len(ref) == 2
        # same global computation, different collectives implementation (gloo across processes)
        assert got == pytest.approx(ref, rel=1e-6, abs=1e-6), (got, ref)
