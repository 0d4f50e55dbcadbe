"""The balanced (document-aware) sequence layout: a per-row permutation that equalises the visible
(query, key) pairs per device under a causal AND document mask (lcx.sharding.layout).

Every strategy's result on it equals the float32 reference (tests/test_attention_strategies.py
and tests/test_attention_sinks.py run it beside contiguous and zigzag); here: the permutation
itself, the data pipeline's use of it, resume, evaluation's undo, and training losses."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from lcx.config import run_config
from lcx.data.stream import lay_out
from lcx.sharding.layout import (
    LAYOUTS,
    apply_layout,
    balanced_chunks,
    check_layout,
    document_work_per_device,
    layout_permutation,
    undo_layout,
)


def packed_row(lengths, pad=0):
    """(positions, segment ids) of documents of ``lengths`` packed into one row, ``pad`` padding
    tokens at the end (segment id -1, positions counting from 0), as lcx.data packs them."""
    pos = np.concatenate([np.arange(n) for n in lengths] + [np.arange(pad)])
    seg = np.concatenate([np.full(n, i + 1) for i, n in enumerate(lengths)] + [np.full(pad, -1)])
    return pos.astype(np.int64), seg.astype(np.int64)


def imbalance(layout, pos, seg, P, block=512):
    perm = layout_permutation(layout, pos.size, P, positions=pos, segment_ids=seg, block=block)
    w = document_work_per_device(perm, pos, seg, P)
    return w.max() / w.mean()


def test_balanced_is_a_layout_and_a_permutation_with_equal_shards():
    assert "balanced" in LAYOUTS
    rng = np.random.default_rng(0)
    for S, P in ((4096, 4), (65536, 8), (16384, 64)):
        lengths = rng.integers(1, S // 3, 40)
        lengths = lengths[np.cumsum(lengths) < S]
        pos, seg = packed_row(lengths, S - lengths.sum())
        perm = layout_permutation("balanced", S, P, positions=pos, segment_ids=seg)
        assert perm.dtype == np.int64 and np.array_equal(np.sort(perm), np.arange(S))
        # deterministic: a pure function of the row
        again = layout_permutation("balanced", S, P, positions=pos.copy(), segment_ids=seg.copy())
        assert np.array_equal(perm, again)
        # each device's chunks keep their original order (segment ids sorted within a shard)
        shards = seg[perm].reshape(P, -1)
        real = [s[s >= 0] for s in shards]
        assert all(np.all(np.diff(s) >= 0) for s in real)


def test_balanced_equalises_packed_documents_where_zigzag_does_not():
    # one long document then short ones: zigzag balances only the single-document triangle
    pos, seg = packed_row([40000, 9000, 7000, 5000, 4536])
    assert pos.size == 65536
    assert imbalance("zigzag", pos, seg, 8) > 1.2
    assert imbalance("balanced", pos, seg, 8) <= 1.02
    # one document: both balance it
    pos1, seg1 = packed_row([65536])
    assert imbalance("zigzag", pos1, seg1, 8) == 1.0
    assert imbalance("balanced", pos1, seg1, 8) <= 1.001


def test_work_counts_equal_the_dense_mask():
    """document_work_per_device is the causal + document mask's visible pairs, counted densely."""
    pos, seg = packed_row([37, 100, 5, 80], pad=34)
    S, P = pos.size, 4
    perm = layout_permutation("balanced", S, P, positions=pos, segment_ids=seg, block=8)
    vis = (seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None]) & (seg[:, None] >= 0)
    dense = vis[perm].reshape(P, -1, S).sum(axis=(1, 2))
    assert np.array_equal(document_work_per_device(perm, pos, seg, P), dense)


def test_chunks_are_at_least_a_kernel_tile_where_the_length_allows():
    assert balanced_chunks(65536, 8, 512) == 8  # 1,024-token chunks
    assert balanced_chunks(16384, 8, 512) == 4  # 512
    assert balanced_chunks(16384, 64, 512) == 2  # 128: the length leaves no longer chunk
    with pytest.raises(ValueError, match="not divisible by 16 .*x 2 for the balanced layout"):
        check_layout("balanced", 4100, 8)


def test_batch_layout_is_per_row_and_undo_restores_the_original_order():
    rng = np.random.default_rng(1)
    rows = [packed_row([1000, 2000, 1096]), packed_row([3000, 1000], pad=96)]
    pos = np.stack([r[0] for r in rows]).astype(np.int32)
    seg = np.stack([r[1] for r in rows]).astype(np.int32)
    batch = {
        "tokens": rng.integers(0, 256, pos.shape).astype(np.int32),
        "positions": pos,
        "segment_ids": seg,
        "loss_mask": (seg >= 0).astype(np.float32),
    }
    out = lay_out(batch, "balanced", 4, 512)
    for b in range(2):
        perm = layout_permutation("balanced", 4096, 4, positions=pos[b], segment_ids=seg[b], block=512)
        for k, v in batch.items():
            assert np.array_equal(out[k][b], v[b][perm]) and out[k].dtype == v.dtype
    back = undo_layout(out["tokens"], "balanced", 4, positions=out["positions"], segment_ids=out["segment_ids"])
    assert np.array_equal(back, batch["tokens"])
    # features after the sequence axis follow their token
    x = rng.standard_normal((2, 4096, 3))
    laid = apply_layout(x, "balanced", 4, axis=1, positions=pos, segment_ids=seg)
    assert np.array_equal(
        undo_layout(laid, "balanced", 4, axis=1, positions=out["positions"], segment_ids=out["segment_ids"]), x
    )
    with pytest.raises(ValueError, match="needs the laid-out rows' positions and segment_ids"):
        undo_layout(out["tokens"], "balanced", 4)


def test_the_training_stream_resumes_exactly_in_the_balanced_layout():
    from lcx.data import StdlibData, make_data

    cfg = StdlibData(name="stdlib", tokenizer="byte", val_fraction=0.02, split_seed=0)
    kw = dict(seq_len=4096, global_batch=2, layout="balanced", context_degree=4, seed=0, layout_block=512)
    a = make_data(cfg, **kw).train
    next(a)
    state = a.state()
    want = next(a)
    b = make_data(cfg, **kw).train
    b.restore(state)
    got = next(b)
    for k in want:
        assert np.array_equal(want[k], got[k]), k
    # the same tokens as the zigzag stream, in another order per row
    z = make_data(cfg, **{**kw, "layout": "zigzag"}).train
    next(z)
    zb = next(z)
    for r in range(2):
        assert np.array_equal(np.sort(zb["tokens"][r]), np.sort(want["tokens"][r]))


@pytest.mark.slow
def test_training_losses_equal_zigzag_for_the_same_data_order(tmp_path, devices):
    """The same batches, laid out zigzag or balanced: every step's loss agrees within 1e-5."""
    import jax
    import test_training as training

    from lcx.training.loop import train

    losses = {}
    for layout in ("zigzag", "balanced"):
        cfg = training._config(
            "model=tiny",
            "train.steps=3",
            "train.seq_len=1024",
            "train.global_batch=2",
            "train.eval_every=0",
            "train.tensorboard=false",
            f"plan.attention.layout={layout}",
        )
        with jax.numpy_dtype_promotion("standard"):
            losses[layout] = train(run_config(cfg), tmp_path / layout, devices).losses
    np.testing.assert_allclose(losses["balanced"], losses["zigzag"], rtol=1e-5, atol=0)


def test_the_ledger_prices_the_measured_packed_imbalance_of_each_layout():
    import csv

    from lcx.cost import causal_imbalance
    from lcx.cost.balance import PACKED_IMBALANCE

    path = pathlib.Path(__file__).resolve().parent.parent / "experiments" / "results" / "load_balance_documents.csv"
    rows = [r for r in csv.DictReader(path.open()) if r["data"] == "stdlib"]
    assert {r["layout"] for r in rows} == set(PACKED_IMBALANCE)
    for r in rows:  # the table is the CSV's, to its printed digits
        assert PACKED_IMBALANCE[r["layout"]][(int(r["seq_len"]), int(r["P"]))] == round(float(r["max_over_mean"]), 3)
    # issue 22's case: 64K, P = 8
    assert causal_imbalance("zigzag", 8, packed_documents=True, seq_len=65536) > 1.3
    assert causal_imbalance("balanced", 8, packed_documents=True, seq_len=65536) <= 1.05
    # nearest measured point; one document per row is counted, not measured
    assert causal_imbalance("zigzag", 8, packed_documents=True, seq_len=70000) == PACKED_IMBALANCE["zigzag"][(65536, 8)]
    assert causal_imbalance("balanced", 8) == causal_imbalance("zigzag", 8) == 1.0


def test_the_planner_searches_the_balanced_layout_for_packed_rows(tmp_path, capsys):
    from hydra import compose, initialize_config_dir

    from lcx.config import plan_query
    from lcx.plan import run

    conf = pathlib.Path(__file__).resolve().parent.parent / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        packed = compose("plan_config", overrides=["planner.packed_documents=true", "train.seq_len=65536"])
        single = compose("plan_config", overrides=["train.seq_len=65536"])
    rec = run(plan_query(packed), tmp_path / "p")["recommendation"]
    assert "(balanced)" in rec["plan"]["name"], rec["plan"]["name"]
    one = run(plan_query(single), tmp_path / "s")["recommendation"]
    assert "(balanced)" not in one["plan"]["name"]
    capsys.readouterr()
