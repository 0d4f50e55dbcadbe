"""Multi-host on JAX's own runtime: two processes with 4 CPU devices each, over loopback, train
one step whose loss equals the single-process 8-device value; each process reads only its own
documents (disjoint, together all of them)."""

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
    # the two processes hold different rows of each batch (plan=ring: data=2 over the processes),
    # so each reads its own shard of the documents; one process reads both shards with
    # data.shards=2 and trains on the same global batches
    r = subprocess.run(
        [sys.executable, "-m", "lcx.train", *COMMON, "data.shards=2", f"hydra.run.dir={single}"],
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


SHARD_SCRIPT = """
import json, sys
import jax
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", 4)
port, pid, corpus, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
from lcx.config.run import data_config
from lcx.data import make_data
from lcx.sharding import bind
from lcx.sharding.config import preset
from lcx.training.preflight import process_shard

mp = bind(preset("ring"), jax.devices())
shard = process_shard(mp.activation_sharding(("batch", "seq")), (4, 64))
cfg = {"name": "text", "paths": [corpus], "format": "auto", "text_field": "text", "document": "file",
       "document_separator": "\\n\\n", "tokenizer": "byte", "val_fraction": 0.1, "split_seed": 0, "workers": 0, "prefetch": 2, "shards": None, "mixture": None}
data = make_data(data_config(cfg), seq_len=64, global_batch=4, process_shard=shard)
p = data.train.packer
docs = [data.tokenizer.decode(p.tokens[s : s + n]) for s, n in zip(p.starts, p.lengths)]
rows = next(data.train)["tokens"].shape[0]
data.train.close()
json.dump({"shard": list(shard), "docs": docs, "rows": rows}, open(out, "w"))
"""


def test_each_process_reads_its_own_documents(tmp_path):
    """Two processes joined by jax.distributed: each holds one of the batch's two halves (plan=ring:
    data=2 over the processes), reads a disjoint shard of the training documents (together all
    of them) and builds only its own 2 rows of the 4-row global batch."""
    from lcx.config.run import data_config
    from lcx.data import make_data

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i} " * (5 + i)}) + "\n" for i in range(40)))
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    port = _free_port()
    outs = [tmp_path / f"proc{i}.json" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SHARD_SCRIPT, str(port), str(i), str(corpus), str(outs[i])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    got = [json.loads(o.read_text()) for o in outs]
    assert [g["shard"] for g in got] == [[0, 2], [1, 2]] and [g["rows"] for g in got] == [2, 2]
    a, b = ({*g["docs"]} for g in got)
    cfg = {"name": "text", "paths": [str(corpus)], "text_field": "text", "tokenizer": "byte", "val_fraction": 0.1}
    cfg |= {"split_seed": 0, "format": "auto", "document": "file", "document_separator": "\n\n"}
    one = make_data(data_config(cfg), seq_len=64, global_batch=4).train.packer
    everything = {one.tokens[s : s + n].tobytes().decode() for s, n in zip(one.starts, one.lengths)}
    assert a and b and not a & b, "the processes' documents are disjoint"
    assert a | b == everything and len(everything) == 36, "together they are all the training documents"
