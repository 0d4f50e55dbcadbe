"""The grain training pipeline (lcx.data.grain_stream): bitwise the stream of the published
default run, worker processes, mixtures, per-process shards, exact resume from grain's state,
old checkpoints' data states, length-extension resumes, and the errors of a bad config."""

import json
import os

import numpy as np
import pytest
from omegaconf import OmegaConf

from lcx.config.run import data_config
from lcx.data import BATCH_KEYS, GrainBatches, Packer, get_tokenizer, lay_out, make_data, split_documents
from lcx.data.config import TextData, check_mixture
from lcx.data.corpora import stdlib_corpus
from lcx.data.corpus_source import shard_plan

CONF = os.path.join(os.path.dirname(__file__), "..", "conf", "data")


def reference_batches(docs, seq_len, batch, seed, layout, degree, n):
    """The default run's stream as lcx computed it before grain (lcx.data.Batches at the commit
    that made experiments/results/default_run.csv), written out here as the reference."""
    packer = Packer(docs, seq_len)
    R, row, out = packer.rows_per_epoch, 0, []
    for _ in range(n):
        parts, left = [], batch
        while left:
            e, r = divmod(row, R)
            k = min(left, R - r)
            index = packer.epoch_index(np.random.default_rng([seed, e]).permutation(packer.num_docs))
            order = np.random.default_rng([seed, e, 1]).permutation(R)
            parts.append(packer.rows_at(index, order[r : r + k]))
            row, left = row + k, left - k
        out.append(lay_out({k: np.concatenate([p[k] for p in parts]) for k in BATCH_KEYS}, layout, degree))
    return out


def stdlib_train_docs():
    """The default run's training documents, as lcx's corpus source tokenized and split them."""
    tok = get_tokenizer("byte")
    docs = [d for d in (tok.encode(t) for t in stdlib_corpus().documents) if d.size]
    train, _ = split_documents(len(docs), 0.02, 0)
    return [docs[i] for i in train]


def stdlib(**over):
    return data_config({**OmegaConf.to_container(OmegaConf.load(os.path.join(CONF, "stdlib.yaml"))), **over})


def assert_same(a, b):
    assert set(a) == set(b) == set(BATCH_KEYS)
    for k in BATCH_KEYS:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("workers", [0, 2])
def test_default_stream_is_bitwise_the_published_one(workers):
    """The default run's shapes (4 rows of 4096 tokens, zigzag over 4 context shards): the grain
    stream, in the trainer or in 2 worker processes, is the pre-grain stream bit for bit."""
    n = 12
    ref = reference_batches(stdlib_train_docs(), 4096, 4, 0, "zigzag", 4, n)
    train = make_data(stdlib(workers=workers), seq_len=4096, global_batch=4, layout="zigzag", context_degree=4).train
    try:
        assert isinstance(train, GrainBatches)
        for want in ref:
            assert_same(next(train), want)
        assert train.state()["tokens"] == {"stdlib": n * 4 * 4096}
        assert (train.state()["epoch"], train.state()["row"]) == (0, n * 4)
    finally:
        train.close()


def tiny_text(tmp_path, name, n, length, char):
    """A JSON-lines file of ``n`` documents: ``char`` then the document's index, ``length`` times."""
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"text": f"{char}{i:03d} " * length}) + "\n" for i in range(n)))
    return str(path)


def text(tmp_path, **over):
    base = OmegaConf.to_container(OmegaConf.load(os.path.join(CONF, "text.yaml")))
    return data_config({**base, "paths": [tiny_text(tmp_path, "a", 30, 40, "a")], **over})


def test_epochs_straddle_batches_and_match_the_reference(tmp_path):
    """A small corpus, many epochs: batches that straddle epoch ends, the balanced layout."""
    cfg = text(tmp_path, val_fraction=0.1)
    tok = get_tokenizer("byte")
    from lcx.data import text_corpus

    docs = [tok.encode(t) for t in text_corpus(cfg.paths).documents]
    train_idx, _ = split_documents(len(docs), 0.1, 0)
    ref = reference_batches([docs[i] for i in train_idx], 256, 3, 5, "balanced", 2, 40)
    train = make_data(cfg, seq_len=256, global_batch=3, layout="balanced", context_degree=2, seed=5).train
    assert train.rows_per_epoch < 40 * 3 / 2  # more than two epochs
    for want in ref:
        assert_same(next(train), want)


def mixture(tmp_path, **over):
    a = tiny_text(tmp_path, "long", 12, 200, "L")
    b = tiny_text(tmp_path, "short", 40, 10, "s")
    entries = [{"paths": [a], "weight": 3, "name": "long"}, {"paths": [b], "weight": 1, "name": "short"}]
    return text(tmp_path, mixture=entries, **over)


def test_mixture_draws_rows_by_weight_deterministically(tmp_path):
    cfg = mixture(tmp_path)
    runs = [make_data(cfg, seq_len=64, global_batch=4, seed=1).train for _ in range(2)]
    other = make_data(cfg, seq_len=64, global_batch=4, seed=2).train
    for _ in range(20):
        a, b, c = next(runs[0]), next(runs[1]), next(other)
        assert_same(a, b)
        # 3 of every 4 rows are long documents' ("L000 L000 ..."), 1 a short one's ("s000 ...")
        letters = {chr(t) for t in a["tokens"].ravel()} & {"L", "s"}
        assert letters == {"L", "s"}
    st = runs[0].state()
    assert st["tokens"] == {"long": 60 * 64, "short": 20 * 64}  # 3:1 of 80 rows
    assert st["sources"] == ["long", "short"] and st["weights"] == [3.0, 1.0]
    assert json.loads(json.dumps(st)) == st
    assert not np.array_equal(a["tokens"], c["tokens"]), "the seed changes the order"


@pytest.mark.parametrize("workers", [0, 2])
def test_restore_from_grain_state_continues_exactly(tmp_path, workers):
    """Resume from state_before(1) (the trainer prefetches one batch): the next batches are the
    uninterrupted stream's, with the mixture, in worker processes."""
    cfg = mixture(tmp_path, workers=workers)
    a = make_data(cfg, seq_len=64, global_batch=4, seed=1).train
    b = make_data(cfg, seq_len=64, global_batch=4, seed=1).train
    try:
        want = [next(a) for _ in range(5)]
        st = a.state_before(1)  # trained on 4 batches, the 5th prefetched
        assert st["batches"] == 4 and st["grain"] is not None
        want += [next(a) for _ in range(4)]
        b.restore(json.loads(json.dumps(st)))
        for w in want[4:]:
            assert_same(next(b), w)
        assert b.state() == a.state()
    finally:
        a.close()
        b.close()


def test_old_checkpoint_states_restore_single_source_and_are_refused_for_a_mixture(tmp_path):
    cfg = text(tmp_path, val_fraction=0.1)
    train = make_data(cfg, seq_len=64, global_batch=4, seed=3).train
    ref = make_data(cfg, seq_len=64, global_batch=4, seed=3).train
    for _ in range(6):
        next(ref)
    old_keys = ("epoch", "row", "seed", "shuffle", "row_shuffle", "seq_len", "num_docs", "num_tokens")
    legacy = {k: v for k, v in ref.state().items() if k in old_keys}  # what lcx.data.Batches.state() wrote
    train.restore(legacy)
    assert_same(next(train), next(ref))
    with pytest.raises(ValueError, match="seed"):
        train.restore({**legacy, "seed": 4})
    mixed = make_data(mixture(tmp_path), seq_len=64, global_batch=4, seed=3).train
    with pytest.raises(ValueError, match="before lcx's grain pipeline"):
        mixed.restore(legacy)


def test_length_extension_resume_continues_at_the_same_tokens(tmp_path):
    cfg = mixture(tmp_path)
    a = make_data(cfg, seq_len=64, global_batch=4, seed=1).train
    for _ in range(6):
        next(a)
    b = make_data(cfg, seq_len=128, global_batch=4, seed=1).train
    b.resume(a.state())
    st = b.state()
    assert st["seq_len"] == 128 and st["offset"] == 6 * 4 * 64 // 128 and st["tokens"] == a.state()["tokens"]
    next(b)
    with pytest.raises(ValueError, match="seq_len"):
        b.restore(a.state())


def test_shards_are_disjoint_and_complete_and_emulate_processes(tmp_path):
    """N processes each read their own shard; one process with data.shards=N reads all N and
    hands out the rows the N processes would (their local batches, concatenated)."""
    cfg = text(tmp_path, val_fraction=0.1, shards=2)
    one = make_data(text(tmp_path, val_fraction=0.1), seq_len=64, global_batch=4).train
    both = make_data(cfg, seq_len=64, global_batch=4).train
    procs = [make_data(cfg, seq_len=64, global_batch=4, process_shard=(i, 2)).train for i in range(2)]
    docs = [{bytes(d) for d in _documents(p.packer)} for p in procs]
    assert not docs[0] & docs[1] and docs[0] | docs[1] == {bytes(d) for d in _documents(one.packer)}
    for _ in range(5):
        whole, parts = next(both), [next(p) for p in procs]
        assert parts[0]["tokens"].shape == (2, 64)
        assert_same(whole, {k: np.concatenate([p[k] for p in parts]) for k in BATCH_KEYS})
    assert both.state()["tokens"] == procs[0].state()["tokens"] == {"text": 5 * 4 * 64}
    assert procs[1].state_before(0)["batches"] == 5


def _documents(packer):
    return [packer.tokens[s : s + n] for s, n in zip(packer.starts, packer.lengths)]


def test_shard_plan():
    assert shard_plan(None, (0, 1)) == (1, [0])
    assert shard_plan(3, (0, 1)) == (3, [0, 1, 2])
    assert shard_plan(None, (1, 2)) == (2, [1]) == shard_plan(2, (1, 2))
    with pytest.raises(ValueError, match="data.shards=3: the processes hold 2"):
        shard_plan(3, (0, 2))


def test_bad_configs_are_refused_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match=r"data.workers=-1: must be >= 0"):
        stdlib(workers=-1)
    with pytest.raises(ValueError, match=r"data.prefetch=0"):
        stdlib(prefetch=0)
    with pytest.raises(ValueError, match=r"data.shards=0"):
        stdlib(shards=0)
    fields = [f for f in TextData.__dataclass_fields__]
    with pytest.raises(ValueError, match=r"data.mixture\[1\] has no paths"):
        check_mixture([{"paths": ["a"], "weight": 1}, {"weight": 2}], fields)
    for w in (0, -1, "x", float("nan"), None):
        with pytest.raises(ValueError, match=r"data.mixture\[0\].weight=.*must be a finite number > 0"):
            check_mixture([{"paths": ["a"], "weight": w}], fields)
    with pytest.raises(ValueError, match=r"data.mixture\[0\].tokenizer: one tokenizer serves every source"):
        check_mixture([{"paths": ["a"], "weight": 1, "tokenizer": "byte"}], fields)
    with pytest.raises(ValueError, match=r"data.mixture\[0\].colour: unknown key"):
        check_mixture([{"paths": ["a"], "weight": 1, "colour": 1}], fields)
    with pytest.raises(ValueError, match=r"two sources share the name"):
        check_mixture([{"paths": ["a"], "weight": 1, "name": "x"}, {"paths": ["b"], "weight": 1, "name": "x"}], fields)
    with pytest.raises(ValueError, match=r"non-empty list"):
        check_mixture([], fields)
    with pytest.raises(ValueError, match=r"global_batch=3 rows do not split into 2 data shards"):
        make_data(text(tmp_path, shards=2), seq_len=64, global_batch=3)


@pytest.mark.slow
def test_sigterm_and_resume_with_a_mixture_and_workers_is_the_uninterrupted_run(tmp_path):
    """A 6-step run on a 2-source JSON-lines mixture built by 2 worker processes, stopped by
    SIGTERM after step 2 or 3 and resumed to step 6, logs the steps after the stop bit for bit as
    an uninterrupted 6-step run (same train.steps, so the same learning-rate schedule)."""
    import signal
    import subprocess
    import sys
    import time

    a = tiny_text(tmp_path, "long", 12, 200, "L")
    b = tiny_text(tmp_path, "short", 40, 10, "s")
    mix = f"data.mixture=[{{paths:['{a}'],weight:3,name:long}},{{paths:['{b}'],weight:1,name:short}}]"
    args = ["model=tiny", "model.n_layers=1", "data=text", mix, "data.workers=2", "train.seq_len=128"]
    args += ["train.global_batch=4", "train.steps=6", "train.eval_every=0", "train.warmup_steps=2"]
    args += ["checkpoint.every=0", "train.tensorboard=false"]
    env = dict(os.environ, JAX_PLATFORMS="cpu")

    def start(name):
        run = tmp_path / name
        cmd = [sys.executable, "-m", "lcx.train", *args, f"checkpoint.dir={tmp_path / name}_ckpt"]
        cmd += [f"hydra.run.dir={run}", "train.reuse_run_dir=true"]
        return run, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)

    def metrics(run):
        path = run / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:  # being written
                break
        return out

    ref_run, p = start("ref")
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    ref = metrics(ref_run)
    assert [r["step"] for r in ref] == [1, 2, 3, 4, 5, 6]
    assert ref[-1]["tokens/long"] == 3 * ref[-1]["tokens/short"] == 3 * 6 * 128
    assert all("data_wait_s" in r for r in ref)

    run, p = start("stopped")
    t0 = time.time()
    while not metrics(run) or metrics(run)[-1]["step"] < 2:
        assert p.poll() is None, p.communicate()[1][-3000:]
        assert time.time() - t0 < 300
        time.sleep(0.01)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 128 + signal.SIGTERM, err[-3000:]
    stopped = metrics(run)[-1]["step"]
    assert 2 <= stopped < 6, stopped

    run, p = start("stopped")
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    got = metrics(run)
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5, 6]
    assert [r.get("resumed_from") for r in got if "resumed_from" in r] == [stopped]
    for key in ("loss", "grad_norm", "lr", "tokens/long", "tokens/short"):
        assert [r[key] for r in got] == [r[key] for r in ref], key


def test_a_new_global_batch_or_worker_count_resumes_at_the_same_row(tmp_path):
    cfg = text(tmp_path, val_fraction=0.1)
    a = make_data(cfg, seq_len=64, global_batch=4, seed=2).train
    for _ in range(3):
        next(a)
    b = make_data(cfg, seq_len=64, global_batch=6, seed=2).train
    b.restore(a.state())
    assert b.state()["offset"] == 12 and b.state()["batches"] == 0
    rows = np.concatenate([next(a)["tokens"] for _ in range(3)])  # rows 12..23
    np.testing.assert_array_equal(np.concatenate([next(b)["tokens"] for _ in range(2)]), rows)
