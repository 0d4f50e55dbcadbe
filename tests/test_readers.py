"""Corpus formats (lcx.data.readers), data.paths rules (lcx.data.paths), data.document=directory,
the presets data=jsonl|parquet|arrayrecord, and every bad-input error. Files are written here with
pyarrow and array_record; nothing is downloaded."""

import json
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from array_record.python.array_record_module import ArrayRecordWriter
from hydra import compose, initialize_config_module

from lcx.config import run_config
from lcx.config.run import data_config
from lcx.data import READERS, make_data, text_corpus
from lcx.data.pipeline import load_corpus
from lcx.data.readers import ArrayRecordReader

# an empty document, non-ASCII text, a long one, newlines, one starting with '{' (not JSON)
DOCS = ["alpha", "", "twö ünïcode ✓", "x" * 3000, "line1\nline2\n", "{not json"]


def write_jsonl(path, docs, field="body"):
    path.write_text("".join(json.dumps({"id": i, field: d}) + "\n" for i, d in enumerate(docs)))
    return str(path)


def write_parquet(path, docs, field="body", kind=None):
    kind = kind or pa.string()
    values = pa.array([d if d is None or kind != pa.binary() else d.encode() for d in docs], kind)
    pq.write_table(pa.table({"id": list(range(len(docs))), field: values}), path, row_group_size=2)
    return str(path)


def write_arrow(path, docs, field="body", stream=False, values=None):
    table = pa.table({"id": list(range(len(docs))), field: pa.array(docs) if values is None else values})
    with (ipc.new_stream if stream else ipc.new_file)(str(path), table.schema) as w:
        w.write_table(table, max_chunksize=2)  # several record batches: rows counted across them
    return str(path)


def write_feather(path, docs, field="body"):
    feather.write_feather(pa.table({field: docs, "id": list(range(len(docs)))}), str(path))  # lz4-compressed
    return str(path)


def write_arrayrecord(path, records):
    w = ArrayRecordWriter(str(path), "group_size:2")
    for r in records:
        w.write(r if isinstance(r, bytes) else r.encode())
    w.close()
    return str(path)


def json_records(docs, field="body"):
    return [json.dumps({"id": i, field: d}) for i, d in enumerate(docs)]


WRITERS = {
    "jsonl": lambda p: write_jsonl(p / "c.jsonl", DOCS),
    "parquet": lambda p: write_parquet(p / "c.parquet", DOCS),
    "parquet-large-string": lambda p: write_parquet(p / "c.parquet", DOCS, kind=pa.large_string()),
    "parquet-binary": lambda p: write_parquet(p / "c.parquet", DOCS, kind=pa.binary()),
    "arrow-file": lambda p: write_arrow(p / "c.arrow", DOCS),
    "arrow-stream": lambda p: write_arrow(p / "c.arrow", DOCS, stream=True),  # as datasets caches are
    "feather": lambda p: write_feather(p / "c.feather", DOCS),
    "arrayrecord-json": lambda p: write_arrayrecord(p / "c.array_record", json_records(DOCS)),
    "arrayrecord-raw": lambda p: write_arrayrecord(p / "c.arrayrecord", DOCS),
}


@pytest.mark.parametrize("kind", list(WRITERS))
def test_each_format_round_trips_the_documents_of_the_jsonl(tmp_path, kind, monkeypatch):
    monkeypatch.setattr(ArrayRecordReader, "chunk", 4)  # records read in several calls
    path = WRITERS[kind](tmp_path)
    c = text_corpus([path], text_field="body")
    assert c.documents == text_corpus([write_jsonl(tmp_path / "ref.jsonl", DOCS)], text_field="body").documents
    assert c.documents == tuple(DOCS)
    where = [f"{path}:{i + 1}" for i in range(len(DOCS))] if kind == "jsonl" else [f"{path}[{i}]" for i in range(6)]
    assert c.names == tuple(where)


def test_every_format_has_a_round_trip_case():
    assert {k.split("-")[0] for k in WRITERS} | {"text"} == set(READERS) | {"feather"}


def test_format_by_suffix_or_forced(tmp_path):
    blob = write_parquet(tmp_path / "shard.bin", DOCS)  # no known suffix: auto reads plain text
    with pytest.raises(ValueError, match=re.escape(f"{blob}: not valid UTF-8 at byte offset")):
        text_corpus([blob])
    assert text_corpus([blob], format="parquet", text_field="body").documents == tuple(DOCS)
    upper = write_parquet(tmp_path / "SHARD.PARQUET", DOCS)  # suffixes are case-insensitive
    assert text_corpus([upper], text_field="body").documents == tuple(DOCS)
    part = write_jsonl(tmp_path / "part-0", DOCS)
    assert text_corpus([part], format="jsonl", text_field="body").documents == tuple(DOCS)
    raw = write_arrayrecord(tmp_path / "r.array_record", json_records(["{a}", "b"]))
    assert text_corpus([raw], text_field=None).documents == tuple(json_records(["{a}", "b"]))  # null: raw text
    with pytest.raises(ValueError, match="SHARD.PARQUET: not valid UTF-8"):  # forced: the suffix is not looked at
        text_corpus([upper], format="text")


def test_paths_globs_directories_and_each_file_once(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / ".git").mkdir()
    (corpus / "b.txt").write_text("b")
    (corpus / "a.md").write_text("a")
    write_jsonl(corpus / "sub" / "c.jsonl", ["c1", "c2"], field="text")
    write_parquet(corpus / "sub" / "d.parquet", ["d0", "d1"], field="text")
    (corpus / ".git" / "HEAD.txt").write_text("hidden")  # names starting with '.' are skipped
    (corpus / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n")  # no known suffix: skipped under auto
    (corpus / "notes.json").write_text("{}")
    c = text_corpus([str(corpus)])
    assert list(c) == ["a", "b", "c1", "c2", "d0", "d1"]  # sorted by path, recursively
    sub = str(corpus / "sub")
    assert c.names == (
        f"{corpus}/a.md",
        f"{corpus}/b.txt",
        f"{sub}/c.jsonl:1",
        f"{sub}/c.jsonl:2",
        f"{sub}/d.parquet[0]",
        f"{sub}/d.parquet[1]",
    )
    # argument order, sorted within each entry; a file named twice (here four times) is read once
    (tmp_path / "link.txt").symlink_to(corpus / "b.txt")
    again = [str(corpus / "b.txt"), str(corpus), str(corpus / "**" / "*.txt"), str(tmp_path / "link.txt")]
    assert list(text_corpus(again)) == ["b", "a", "c1", "c2", "d0", "d1"]
    # a glob that matches directories reads them
    assert list(text_corpus([str(corpus / "s*")])) == ["c1", "c2", "d0", "d1"]
    # a set format reads every (non-hidden) file of a directory as that format
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "README").write_text("r")
    (texts / "x.weird").write_text("w")
    (texts / ".DS_Store").write_bytes(b"\xff")
    assert list(text_corpus([str(texts)], format="text")) == ["r", "w"]
    with pytest.raises(
        FileNotFoundError, match=re.escape(f"directory {str(texts)!r} holds no file with a known suffix")
    ):
        text_corpus([str(texts)])


def test_a_directory_as_one_document(tmp_path):
    repos = tmp_path / "repos"
    for rel, text in {
        "r1/README.md": "readme",
        "r1/src/main.py": "print(1)",
        "r1/src/empty.py": "",
        "r1/LICENSE": "unread: no known suffix",
        "r2/lib.rs": "fn f() {}",
        "top.md": "a file at the top",
    }.items():
        (repos / rel).parent.mkdir(parents=True, exist_ok=True)
        (repos / rel).write_text(text)
    c = text_corpus([str(repos / "*")], document="directory")
    assert list(c) == ["readme\n\nprint(1)", "fn f() {}", "a file at the top"]  # empty files left out
    assert c.names == (str(repos / "r1"), str(repos / "r2"), str(repos / "top.md"))
    c = text_corpus([str(repos)], document="directory", document_separator="<|file|>")
    assert list(c) == ["readme<|file|>print(1)<|file|>fn f() {}<|file|>a file at the top"]
    # records of a directory's record files join too, in file then record order
    write_jsonl(repos / "r2" / "issues.jsonl", ["i1", "i2"], field="text")
    assert list(text_corpus([str(repos / "r2")], document="directory")) == ["i1\n\ni2\n\nfn f() {}"]
    # through the config: data=text data.document=directory
    cfg = data_config(
        {**_text_yaml(), "paths": [str(repos / "*")], "document": "directory", "document_separator": "\n#\n"}
    )
    assert list(load_corpus(cfg)) == ["readme\n#\nprint(1)", "i1\n#\ni2\n#\nfn f() {}", "a file at the top"]


def _text_yaml():
    from omegaconf import OmegaConf

    conf = os.path.join(os.path.dirname(__file__), "..", "conf", "data", "text.yaml")
    return dict(OmegaConf.to_container(OmegaConf.load(conf)))  # type: ignore[arg-type]


# -- bad input ----------------------------------------------------------------------------------


def _raises(exc, match, *args, **kwargs):
    with pytest.raises(exc, match=match):
        text_corpus(*args, **kwargs)


def test_missing_paths_and_empty_file_sets_are_named(tmp_path):
    _raises(
        FileNotFoundError,
        re.escape(f"data path {str(tmp_path / 'x.parquet')!r} not found"),
        [str(tmp_path / "x.parquet")],
    )
    _raises(
        FileNotFoundError, re.escape(f"glob {str(tmp_path / '*.arrow')!r} matched no file"), [str(tmp_path / "*.arrow")]
    )
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "img.png").write_bytes(b"\x89PNG")
    _raises(FileNotFoundError, r"only' holds no file with a known suffix \(text: .txt", [str(tmp_path / "only")])
    _raises(ValueError, "data.paths needs at least one path", [])
    empty = write_parquet(tmp_path / "e.parquet", [""], field="text")
    _raises(ValueError, r"is empty \(1 documents, 0 characters\)", [empty])


def test_bad_records_name_the_file_and_the_record(tmp_path):
    p = write_parquet(tmp_path / "p.parquet", ["a", "b"])
    _raises(ValueError, re.escape(f"{p}: no column 'text' (columns: ['id', 'body']); set data.text_field"), [p])
    _raises(ValueError, re.escape(f"{p}: column 'id' holds int64, not strings"), [p], text_field="id")
    a = write_arrow(tmp_path / "a.arrow", ["a", "b"])
    _raises(ValueError, re.escape(f"{a}: no column 'text' (columns: ['id', 'body'])"), [a])
    nulls = write_parquet(tmp_path / "n.parquet", ["a", "b", None], field="text")
    _raises(ValueError, re.escape(f"{nulls}[2]: column 'text' is null, not a string"), [nulls])
    r = write_arrayrecord(tmp_path / "r.array_record", [json.dumps({"text": "a"}), json.dumps({"body": "b", "id": 1})])
    _raises(ValueError, re.escape(f"{r}[1]: record has no field 'text' (found ['body', 'id'])"), [r])
    r = write_arrayrecord(tmp_path / "i.array_record", [json.dumps({"text": "a"}), json.dumps({"text": 5})])
    _raises(ValueError, re.escape(f"{r}[1]: field 'text' is a int, not a string"), [r])
    r = write_arrayrecord(tmp_path / "j.array_record", [json.dumps({"text": "a"}), '{"text": '])
    _raises(ValueError, re.escape(f"{r}[1]: invalid JSON (Expecting value at column 10)"), [r])
    j = write_jsonl(tmp_path / "n.jsonl", ["a"])
    _raises(ValueError, re.escape(f"{j}: data.text_field is null"), [j], text_field=None)


def test_invalid_utf8_names_the_record_and_the_byte(tmp_path, monkeypatch):
    monkeypatch.setattr(ArrayRecordReader, "chunk", 2)  # record 2 comes in the second call
    bad = [b"ok", b"fine", b"\xe9t\xe9", b"caf\xe9"]
    p = tmp_path / "b.parquet"
    pq.write_table(pa.table({"text": pa.array(bad, pa.binary())}), p, row_group_size=2)
    _raises(ValueError, re.escape(f"{p}[2]: not valid UTF-8 at byte offset 0 of the value"), [str(p)])
    s = tmp_path / "s.parquet"  # a string column holding invalid UTF-8 (a writer that did not check)
    pq.write_table(pa.table({"text": pa.array(bad, pa.binary()).view(pa.string())}), s, row_group_size=2)
    _raises(ValueError, re.escape(f"{s}[2]: not valid UTF-8 at byte offset 0 of the value"), [str(s)])
    a = write_arrow(tmp_path / "b.arrow", [""] * 4, field="text", values=pa.array(bad[:3] + [b"ok"], pa.binary()))
    _raises(ValueError, re.escape(f"{a}[2]: not valid UTF-8 at byte offset 0 of the value"), [a])
    r = write_arrayrecord(tmp_path / "b.array_record", [b"raw", b"text", b"caf\xe9 au lait"])
    _raises(ValueError, re.escape(f"{r}[2]: not valid UTF-8 at byte offset 3 of the record"), [r])
    j = tmp_path / "b.jsonl"
    j.write_bytes(b'{"text": "x"}\n\n{"text": "caf\xe9"}\n')
    _raises(ValueError, re.escape(f"{j}:3: not valid UTF-8 at byte offset 28 ("), [str(j)])


def test_files_not_of_their_format_and_unknown_names(tmp_path):
    junk = tmp_path / "junk"
    junk.write_bytes(b"hello world " * 10)
    _raises(ValueError, r"junk: not a Parquet file \(pyarrow: ", [str(junk)], format="parquet")
    _raises(ValueError, r"junk: not an Arrow IPC file or stream .*Feather v1", [str(junk)], format="arrow")
    _raises(ValueError, r"junk: not a readable ArrayRecord file", [str(junk)], format="arrayrecord")
    known = "use one of auto, text, jsonl, parquet, arrow, arrayrecord"
    _raises(ValueError, f"unknown data.format 'csv'; {known}", [str(junk)], format="csv")
    _raises(ValueError, "unknown data.document 'repo'; use one of file, directory", [str(junk)], document="repo")
    # the config refuses them when it is parsed, before any file is read
    for key, value, msg in (("format", "csv", known), ("document", "repo", "use one of file, directory")):
        with pytest.raises(ValueError, match=f"unknown data.{key} '{value}'; {msg}"):
            data_config({**_text_yaml(), "paths": ["x"], key: value})


# -- presets through Hydra, and training on each -------------------------------------------------

PRESETS = {
    "jsonl": lambda p, docs: write_jsonl(p / "corpus.txt", docs, field="text"),  # forced: any suffix
    "parquet": lambda p, docs: write_parquet(p / "corpus.parquet", docs, field="text"),
    "arrayrecord": lambda p, docs: write_arrayrecord(p / "corpus.array_record", json_records(docs, "text")),
}


def _compose(*overrides):
    with initialize_config_module("lcx.conf", version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _real_docs(n=40):
    from lcx.data import stdlib_corpus

    return [d for d in stdlib_corpus().documents if d][:n]


@pytest.mark.parametrize("preset", list(PRESETS))
def test_presets_compose_and_build_batches(tmp_path, preset):
    docs = [f"document {i}: " + "lorem ipsum " * (i + 1) for i in range(20)]
    path = PRESETS[preset](tmp_path, docs)
    data = run_config(_compose(f"data={preset}", f"data.paths=[{path}]")).data
    assert data.name == preset and data.format == preset and data.text_field == "text"
    assert data.document == "file" and data.document_separator == "\n\n"
    assert list(load_corpus(data)) == docs
    train, val, tok = make_data(data, seq_len=32, global_batch=2)
    assert train.packer.num_docs + val.packer.num_docs == 20
    assert tok.decode(np.concatenate([train.packer.tokens, val.packer.tokens])).count("document") == 20


@pytest.mark.parametrize("preset", list(PRESETS))
def test_training_runs_on_each_preset(tmp_path, preset, devices):
    """python -m lcx.train data=<preset> data.paths=[<file>] model=tiny ... (about 5 s each)."""
    import jax

    from lcx.training.loop import train

    path = PRESETS[preset](tmp_path, _real_docs())
    cfg = _compose(
        f"data={preset}",
        f"data.paths=[{path}]",
        "model=tiny",
        "train.seq_len=256",
        "train.steps=2",
        "train.eval_every=0",
    )
    with jax.numpy_dtype_promotion("standard"):  # optax's bias correction, as in test_training.py
        out = train(run_config(cfg), tmp_path / "run", devices)
    assert len(out.losses) == 2 and np.all(np.isfinite(out.losses))
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2]
