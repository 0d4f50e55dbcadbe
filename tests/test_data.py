"""Data pipeline: corpora, byte tokenizer, packing invariants, layouts, determinism, state, errors."""

import collections
import hashlib
import json
import os
import platform
import re
import sysconfig

import numpy as np
import pytest
from omegaconf import OmegaConf

from lcx.config.run import data_config
from lcx.data import (
    BATCH_KEYS,
    Batches,
    ByteTokenizer,
    EvalBatches,
    Packer,
    get_tokenizer,
    make_data,
    pack_documents,
    split_documents,
    stdlib_corpus,
    text_corpus,
    unigram_entropy,
)
from lcx.data.packing import PAD_SEGMENT
from lcx.sharding.layout import layout_permutation, undo_layout

# the first 16 hex digits of the SHA-256 of the embedded snapshot's documents joined by NUL
STDLIB_SHA256_16 = "270eed6fbd322f16"

CONF = os.path.join(os.path.dirname(__file__), "..", "conf", "data")
LENGTHS = [0, 1, 3, 8, 9, 20, 0, 5, 17, 2, 31]  # empty, 1-token, shorter/equal/longer than a row


def unique_docs(lengths=LENGTHS):
    """Documents whose every token is unique: doc i, offset o -> 1000 * (i + 1) + o."""
    return [1000 * (i + 1) + np.arange(n, dtype=np.int32) for i, n in enumerate(lengths)]


def where(token):
    """(document, offset) of a unique token."""
    return int(token) // 1000 - 1, int(token) % 1000


def check_rows(rows, docs, seq_len):
    """Every invariant of packed rows of unique-token documents; returns the (doc, offset) list."""
    for k in BATCH_KEYS:
        assert rows[k].shape[-1] == seq_len
        assert rows[k].dtype == (np.float32 if k == "loss_mask" else np.int32), k
    seen = []
    for b in range(rows["tokens"].shape[0]):
        tok, tgt, pos, seg, mask = (rows[k][b] for k in BATCH_KEYS)
        pad = seg < 0
        assert (seg[pad] == PAD_SEGMENT).all() and PAD_SEGMENT == -1, "padding is segment id -1"
        assert (seg >= 0).sum() == (seg > 0).sum(), "documents are 1, 2, 3, ...: no segment id 0"
        assert (tok[pad] == 0).all() and (tgt[pad] == 0).all() and (mask[pad] == 0).all()
        # padding only at the end of a row, counting like one pseudo-document
        if pad.any():
            first = int(np.argmax(pad))
            assert pad[first:].all()
            np.testing.assert_array_equal(pos[first:], np.arange(seq_len - first))
        real = np.flatnonzero(~pad)
        if real.size == 0:  # an all-padding row (filling a last evaluation batch)
            continue
        segs = seg[real]
        # segment ids: 1, 2, 3, ... in order, one per document piece, contiguous
        assert segs[0] == 1 and set(np.diff(segs)) <= {0, 1}
        for s in np.unique(segs):
            cols = real[segs == s]
            pieces = [where(t) for t in tok[cols]]
            assert len({d for d, _ in pieces}) == 1, "one segment holds one document"
            d, o0 = pieces[0]
            np.testing.assert_array_equal([o for _, o in pieces], o0 + np.arange(len(cols)))
            # positions restart at every piece (document start or row start)
            np.testing.assert_array_equal(pos[cols], np.arange(len(cols)))
            assert o0 == 0 or cols[0] == 0, "a piece starts at its document start or the row start"
        # different segments hold different documents
        docs_in_row = [where(tok[real[segs == s][0]])[0] for s in np.unique(segs)]
        assert len(docs_in_row) == len(set(docs_in_row))
        for c in real:
            d, o = where(tok[c])
            seen.append((d, o))
            if o + 1 < len(docs[d]):  # target: the next token of the same document
                assert tgt[c] == docs[d][o + 1] and mask[c] == 1.0
            else:  # the document's last token has no target
                assert tgt[c] == 0 and mask[c] == 0.0
        assert (pos < seq_len).all()
    return seen


# -- tokenizer ---------------------------------------------------------------------------------


def test_byte_tokenizer_round_trip():
    tok = get_tokenizer("byte")
    assert isinstance(tok, ByteTokenizer) and tok.vocab_size == 256
    for s in ["", "hello", "naïve café — ∑ 漢字 🙂\n\t\x00"]:
        ids = tok.encode(s)
        assert ids.dtype == np.int32 and ids.shape == (len(s.encode()),)
        assert ids.min(initial=0) >= 0 and ids.max(initial=0) < 256
        assert tok.decode(ids) == s
    assert tok.decode([0xFF, 0x41]) == "\ufffdA"  # model samples need not be valid UTF-8
    with pytest.raises(ValueError, match=r"\[0, 255\]"):
        tok.decode([256])
    with pytest.raises(ValueError, match="unknown tokenizer"):
        get_tokenizer("bpe")


# -- packing -----------------------------------------------------------------------------------


def test_pack_exact_values():
    rows = pack_documents([np.array([1, 2, 3]), np.array([4, 5]), np.array([6, 7, 8, 9, 10])], 4)
    expected = {
        "tokens": [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 0, 0]],
        "targets": [[2, 3, 0, 5], [0, 7, 8, 9], [10, 0, 0, 0]],
        "positions": [[0, 1, 2, 0], [0, 0, 1, 2], [0, 1, 0, 1]],
        "segment_ids": [[1, 1, 1, 2], [1, 2, 2, 2], [1, 1, -1, -1]],  # -1: padding
        "loss_mask": [[1, 1, 0, 1], [0, 1, 1, 1], [1, 0, 0, 0]],
    }
    assert set(rows) == set(BATCH_KEYS)
    for k, v in expected.items():
        np.testing.assert_array_equal(rows[k], np.array(v, rows[k].dtype), err_msg=k)


@pytest.mark.parametrize("seq_len", [2, 4, 8, 16, 64])
def test_packing_loses_and_duplicates_no_token(seq_len):
    docs = unique_docs()
    rows = pack_documents(docs, seq_len)
    total = sum(LENGTHS)
    assert rows["tokens"].shape == (-(-total // seq_len), seq_len)
    seen = check_rows(rows, docs, seq_len)
    expected = [(d, o) for d, n in enumerate(LENGTHS) for o in range(n)]
    assert collections.Counter(seen) == collections.Counter(expected)  # each exactly once
    assert len(seen) == total  # empty documents are skipped, contributing nothing
    nonempty = sum(n > 0 for n in LENGTHS)
    assert rows["loss_mask"].sum() == total - nonempty
    assert (rows["segment_ids"] == -1).sum() == rows["tokens"].size - total  # padding: last row only


def test_packer_rejects_empty_and_short():
    with pytest.raises(ValueError, match="empty corpus"):
        Packer([np.zeros(0, np.int32)] * 3, 8)
    for bad in (1, 0, -4):
        with pytest.raises(ValueError, match=">= 2 tokens"):
            Packer(unique_docs(), bad)


# -- batches, layouts, determinism, state ------------------------------------------------------


def make(seed=0, **kw):
    kw = {"seq_len": 8, "global_batch": 3, **kw}
    return Batches(unique_docs(), seed=seed, **kw)


def test_batches_cover_each_epoch_exactly_once():
    it = make(global_batch=5)  # 96 tokens -> 12 rows per epoch; batches straddle epochs
    R = it.rows_per_epoch
    assert R == 12 and it.batches_per_epoch == 12 / 5
    rows = [next(it) for _ in range(6)]  # 30 rows: epochs 0, 1 and half of 2
    flat = {k: np.concatenate([r[k] for r in rows]) for k in BATCH_KEYS}
    expected = collections.Counter((d, o) for d, n in enumerate(LENGTHS) for o in range(n))
    orders = []
    for e in range(2):
        epoch = {k: v[e * R : (e + 1) * R] for k, v in flat.items()}
        assert collections.Counter(check_rows(epoch, unique_docs(), 8)) == expected
        orders.append([where(t)[0] for t in epoch["tokens"][epoch["segment_ids"] > 0]])
    assert orders[0] != orders[1], "documents are reshuffled each epoch"
    assert it.epoch == 2


def test_rows_are_shuffled_not_only_documents():
    """A long document spans many packed rows: consecutive batches must not walk through it row
    after row (they did, and runs of alike batches made the default run's loss spike)."""
    docs = [np.arange(1000, dtype=np.int32) + 1000 * i for i in range(3)]  # 3 documents of 1000 tokens

    def continuations(it, n):  # batches whose row continues the previous batch's row
        firsts = [int(next(it)["tokens"][0, 0]) for _ in range(n)]
        return sum(b == a + 8 for a, b in zip(firsts, firsts[1:]))

    shuffled = Batches(docs, seq_len=8, global_batch=1, seed=0)
    in_order = Batches(docs, seq_len=8, global_batch=1, shuffle=False)
    R = shuffled.rows_per_epoch  # 375 rows, one epoch
    assert continuations(in_order, R) == R - 1  # every row continues the one before
    assert continuations(shuffled, R) <= 5  # a random order continues about once per epoch
    np.testing.assert_array_equal(in_order.row_order(0), np.arange(R))
    assert sorted(shuffled.row_order(0)) == list(range(R)) and list(shuffled.row_order(0)) != list(range(R))
    # a stream saved before rows were shuffled cannot resume mid-epoch: it would see other rows
    old = {k: v for k, v in shuffled.state().items() if k != "row_shuffle"}
    with pytest.raises(ValueError, match="visits rows in order, this run's shuffled"):
        Batches(docs, seq_len=8, global_batch=1, seed=0).restore({**old, "row": 3})


def test_determinism_and_seed_dependence():
    a, b, c = make(0), make(0), make(1)
    for _ in range(7):
        x, y, _z = next(a), next(b), next(c)
        for k in BATCH_KEYS:
            np.testing.assert_array_equal(x[k], y[k])
    assert any(not np.array_equal(next(a)["tokens"], next(c)["tokens"]) for _ in range(3))
    fixed = Batches(unique_docs(), seq_len=8, global_batch=3, shuffle=False)
    np.testing.assert_array_equal(fixed.epoch_order(0), fixed.epoch_order(5))


@pytest.mark.parametrize("degree", [1, 2, 4])
def test_zigzag_applied_consistently_to_all_five_arrays(degree):
    contiguous, zigzag = make(seq_len=16), make(seq_len=16, layout="zigzag", context_degree=degree)
    if degree > 1:
        assert not np.array_equal(layout_permutation("zigzag", 16, degree), np.arange(16))
    for _ in range(4):
        c, z = next(contiguous), next(zigzag)
        assert set(z) == set(BATCH_KEYS)
        for k in BATCH_KEYS:
            assert z[k].dtype == c[k].dtype and z[k].shape == c[k].shape == (3, 16)
            np.testing.assert_array_equal(undo_layout(z[k], "zigzag", degree), c[k], err_msg=k)
            np.testing.assert_array_equal(z[k], c[k][:, layout_permutation("zigzag", 16, degree)])


def test_state_restore_and_skip():
    a = make(global_batch=5)
    for _ in range(3):
        next(a)
    state = a.state()
    assert json.loads(json.dumps(state)) == state  # plain ints: checkpoint-friendly
    assert (state["epoch"], state["row"]) == (1, 3)
    want = [next(a) for _ in range(4)]
    for resumed in (make(global_batch=5, state=state), make(global_batch=5)):
        if resumed.state() != state:
            resumed.restore(state)
        for w in want:
            got = next(resumed)
            for k in BATCH_KEYS:
                np.testing.assert_array_equal(got[k], w[k])
    skipped = make(global_batch=5)
    skipped.skip(3)
    assert skipped.state() == state
    with pytest.raises(ValueError, match="seed"):
        make(seed=1, global_batch=5).restore(state)
    with pytest.raises(ValueError, match="out of range"):
        make(global_batch=5).restore({**state, "row": 99})
    with pytest.raises(ValueError, match="skip forward"):
        skipped.skip(-1)


def test_eval_batches_one_padded_pass():
    docs = unique_docs()
    ev = EvalBatches(docs, seq_len=8, global_batch=5)  # 12 rows -> 3 batches, 3 padding rows
    assert len(ev) == 3 and ev.num_tokens == sum(LENGTHS)
    batches = list(ev)
    assert all(b["tokens"].shape == (5, 8) for b in batches)
    flat = {k: np.concatenate([b[k] for b in batches]) for k in BATCH_KEYS}
    seen = check_rows(flat, docs, 8)
    assert sorted(seen) == sorted((d, o) for d, n in enumerate(LENGTHS) for o in range(n))
    assert flat["loss_mask"].sum() == ev.num_targets
    assert (flat["segment_ids"][12:] == -1).all() and (flat["loss_mask"][12:] == 0).all()
    np.testing.assert_array_equal(list(ev)[1]["tokens"], ev[1]["tokens"])  # re-iterable
    np.testing.assert_array_equal(ev[-1]["tokens"], ev[2]["tokens"])
    with pytest.raises(IndexError):
        ev[3]


def test_construction_errors():
    with pytest.raises(ValueError, match=">= 2 tokens"):
        make(seq_len=1)
    with pytest.raises(ValueError, match="global batch"):
        make(global_batch=0)
    with pytest.raises(ValueError, match="not divisible by 8"):
        make(seq_len=12, layout="zigzag", context_degree=4)
    with pytest.raises(ValueError, match="unknown sequence layout"):
        make(layout="striped")


# -- split -------------------------------------------------------------------------------------


def test_split_by_document():
    train, val = split_documents(100, 0.05, seed=0)
    assert len(val) == 5 and len(train) == 95
    assert not set(train) & set(val) and sorted(np.concatenate([train, val])) == list(range(100))
    np.testing.assert_array_equal(val, split_documents(100, 0.05, seed=0)[1])
    assert not np.array_equal(val, split_documents(100, 0.05, seed=1)[1])
    assert len(split_documents(10, 0.001)[1]) == 1  # at least one
    assert len(split_documents(2, 0.99)[0]) == 1  # at least one stays for training
    with pytest.raises(ValueError, match="at least 2 non-empty documents"):
        split_documents(1, 0.1)
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        split_documents(10, 0.0)


# -- corpora -----------------------------------------------------------------------------------


def test_stdlib_corpus():
    c = stdlib_corpus()
    # the embedded snapshot of CPython 3.11.7's library: the same bytes on every Python version
    assert (len(c), c.num_bytes) == (734, 12_118_641)
    assert hashlib.sha256("\0".join(c.documents).encode()).hexdigest()[:16] == STDLIB_SHA256_16
    assert list(c.names) == sorted(c.names)
    assert all(n.endswith(".py") for n in c.names)
    parts = {p for n in c.names for p in n.split(os.sep)[:-1]}
    assert not parts & {"site-packages", "test", "tests", "idle_test"}
    assert any(n == "os.py" for n in c.names) and all(isinstance(d, str) for d in c)
    assert max(len(d) for d in c) > 100_000  # real, long documents
    h = unigram_entropy([ByteTokenizer().encode(d) for d in c.documents[:50]])
    assert 2.0 < h < np.log(256)


def test_stdlib_corpus_of_a_directory():
    """stdlib_corpus(root) reads a library directory (here the running interpreter's); on CPython
    3.11.7 that is exactly the embedded snapshot."""
    c = stdlib_corpus(sysconfig.get_paths()["stdlib"])
    assert 300 < len(c) < 3000 and 8e6 < c.num_bytes < 16e6
    assert list(c.names) == sorted(c.names)
    if platform.python_version() == "3.11.7":
        assert (c.names, c.documents) == (stdlib_corpus().names, stdlib_corpus().documents)
    with pytest.raises(FileNotFoundError, match="not found; use data=text"):
        stdlib_corpus(os.path.join(sysconfig.get_paths()["stdlib"], "no-such-dir"))


def test_unigram_entropy_exact():
    assert unigram_entropy(np.array([3, 3, 3])) == 0.0
    np.testing.assert_allclose(unigram_entropy(np.array([0, 0, 1, 1])), np.log(2), rtol=1e-12)
    np.testing.assert_allclose(unigram_entropy([np.arange(4), np.arange(4)]), np.log(4), rtol=1e-12)
    with pytest.raises(ValueError, match="empty"):
        unigram_entropy(np.zeros(0, np.int32))


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


def test_text_corpus_files_globs_and_jsonl(tmp_path):
    a = write(tmp_path / "a.txt", "alpha")
    write(tmp_path / "docs" / "b.md", "beta")
    write(tmp_path / "docs" / "sub" / "c.md", "gamma")
    write(tmp_path / "docs" / "sub" / "empty.md", "")
    j = write(
        tmp_path / "r.jsonl",
        json.dumps({"body": "one", "id": 1}) + "\n\n" + json.dumps({"body": "twö"}) + "\n",
    )
    c = text_corpus([a, str(tmp_path / "docs" / "**" / "*.md"), j, a], text_field="body")
    assert list(c) == ["alpha", "beta", "gamma", "", "one", "twö"]  # each file once
    assert c.names[-1] == f"{j}:3" and c.names[-2] == f"{j}:1"
    assert text_corpus(str(tmp_path / "docs" / "*.md")).documents == ("beta",)  # no recursion


def test_text_corpus_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt.*not found"):
        text_corpus([str(tmp_path / "nope.txt")])
    with pytest.raises(FileNotFoundError, match="matched no file"):
        text_corpus([str(tmp_path / "*.txt")])
    with pytest.raises(FileNotFoundError, match=re.escape(f"{str(tmp_path)!r} holds no file with a known suffix")):
        text_corpus([str(tmp_path)])  # a directory is read (tests/test_readers.py), an empty one refused
    bad = write(tmp_path / "latin.txt", b"caf\xe9 ok")
    with pytest.raises(ValueError, match=r"latin.txt: not valid UTF-8 at byte offset 3"):
        text_corpus([bad])
    badj = write(tmp_path / "bad.jsonl", b'{"text": "x"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid UTF-8 at byte offset 27"):
        text_corpus([badj])
    nofield = write(tmp_path / "nofield.jsonl", '{"text": "x"}\n{"content": "y"}\n')
    with pytest.raises(ValueError, match=r"nofield.jsonl:2: record has no field 'text'.*data.text_field"):
        text_corpus([nofield])
    broken = write(tmp_path / "broken.jsonl", '{"text": "x"}\n{"text": \n')
    with pytest.raises(ValueError, match=r"broken.jsonl:2: invalid JSON"):
        text_corpus([broken])
    empty = write(tmp_path / "empty.txt", "")
    with pytest.raises(ValueError, match="is empty"):
        text_corpus([empty, write(tmp_path / "e.jsonl", "\n")])
    with pytest.raises(ValueError, match="data.paths needs at least one path"):
        text_corpus([])


# -- make_data and the Hydra configs -----------------------------------------------------------


def test_make_data_text_config(tmp_path):
    for i in range(40):  # unique document contents: "<i>" repeated
        write(tmp_path / f"d{i:02d}.txt", f"<{i}>" * (3 + i))
    cfg = OmegaConf.load(os.path.join(CONF, "text.yaml"))
    cfg.paths = [str(tmp_path / "*.txt")]
    cfg.val_fraction = 0.1
    train, val, tok = make_data(data_config(cfg), seq_len=16, global_batch=4, layout="zigzag", context_degree=2, seed=3)
    assert tok.vocab_size == 256 and len(val) >= 1
    b = next(train)
    assert {k: (v.shape, v.dtype) for k, v in b.items()} == {
        k: ((4, 16), np.float32 if k == "loss_mask" else np.int32) for k in BATCH_KEYS
    }
    train_text = tok.decode(train.packer.tokens)
    val_text = tok.decode(val.packer.tokens)
    val_docs = {f"<{i}>" * (3 + i) for i in range(40) if f"<{i}>" in val_text}
    assert len(val_docs) == 4  # 10% of 40 documents
    assert not any(f"<{i}>" in train_text for i in range(40) if f"<{i}>" * (3 + i) in val_docs)
    assert len(train_text) + len(val_text) == sum((2 + len(str(i))) * (3 + i) for i in range(40))


def test_make_data_errors():
    text = OmegaConf.load(os.path.join(CONF, "text.yaml"))
    with pytest.raises(ValueError, match=r"data.paths"):
        make_data(data_config(text), seq_len=16, global_batch=2)
    stdlib = OmegaConf.load(os.path.join(CONF, "stdlib.yaml"))
    with pytest.raises(ValueError, match="unknown data.name"):
        make_data(data_config({"name": "wiki"}), seq_len=16, global_batch=2)
    with pytest.raises(ValueError, match=">= 2 tokens"):  # before the corpus is even read
        make_data(data_config(stdlib), seq_len=1, global_batch=2)
    with pytest.raises(ValueError, match="not divisible"):
        make_data(data_config(stdlib), seq_len=30, global_batch=2, layout="zigzag", context_degree=4)


def test_make_data_stdlib_default():
    cfg = OmegaConf.load(os.path.join(CONF, "stdlib.yaml"))
    train, val, tok = make_data(data_config(cfg), seq_len=64, global_batch=2, layout="zigzag", context_degree=2)
    n = sum(1 for d in stdlib_corpus() if d)  # a few __init__.py files are empty: skipped
    assert train.packer.num_docs + val.packer.num_docs == n
    assert val.packer.num_docs == round(0.02 * n)
    assert train.num_tokens + val.num_tokens == stdlib_corpus().num_bytes
    assert val.unigram_entropy() > 2.0
    data = make_data(data_config(cfg), seq_len=64, global_batch=2)
    assert data.unigram_entropy() == data.val.unigram_entropy()
    firsts = list(data.val_batches(3))
    assert len(firsts) == 3 and len(list(data.val_batches())) == len(data.val)
    np.testing.assert_array_equal(firsts[2]["tokens"], data.val[2]["tokens"])
    b = next(train)
    assert (b["loss_mask"] > 0).sum() > 0 and b["tokens"].max() < tok.vocab_size


def test_hydra_data_group_override_syntax(tmp_path):
    from hydra import compose, initialize_config_dir

    write(tmp_path / "a.txt", "first document " * 20)
    write(tmp_path / "docs" / "b.md", "second document " * 20)
    with initialize_config_dir(config_dir=os.path.abspath(os.path.join(CONF, "..")), version_base=None):
        cfg = compose("config", overrides=["data=text", "data.paths=[a.txt,'docs/*.md']"])
        assert cfg.data.name == "text" and list(cfg.data.paths) == ["a.txt", "docs/*.md"]
        paths = f"data.paths=[{tmp_path}/a.txt,'{tmp_path}/docs/*.md']"
        cfg = compose("config", overrides=["data=text", paths])
        train, val, _ = make_data(data_config(cfg.data), seq_len=16, global_batch=2)
        assert train.packer.num_docs == val.packer.num_docs == 1
