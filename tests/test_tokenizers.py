"""Tokenizers: Hugging Face tokenizer.json files through ``tokenizers`` (built here with its
trainers, nothing downloaded), the one BOS/EOS rule and its overrides, the model vocabulary taken
from the tokenizer (padded to 128) or refused before compiling, the embedded BPE, parity with
transformers (a committed fixture), and a 2-step training run on ``data=stdlib_bpe``."""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.resources
import json
import pathlib
import tomllib

import numpy as np
import pytest
from hydra import compose, initialize_config_module

from lcx.config import run_config
from lcx.data import make_data, stdlib_corpus
from lcx.data.pipeline import split_documents
from lcx.data.tokenizers import (
    STDLIB_BPE,
    STDLIB_BPE_SHA256,
    ByteTokenizer,
    HFTokenizer,
    check_model_vocab,
    get_tokenizer,
    padded_vocab_size,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
PARITY = ROOT / "tests" / "fixtures" / "hf_tokenizer_parity"
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "naïve café — ∑ 漢字 🙂\t tabs  and   spaces",
    "x",
    "The quick brown fox jumps over the lazy dog. " * 3,
]


def _bpe(post: str | None = None, vocab_size: int = 300, extra_special: tuple[str, ...] = ()):
    """A byte-level BPE trained here; ``post``: a TemplateProcessing ``single`` template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, *extra_special],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TEXTS * 10, trainer)
    if post is not None:
        specials = [(t, tok.token_to_id(t)) for t in (BOS, EOS, *extra_special)]
        tok.post_processor = processors.TemplateProcessing(single=post, special_tokens=specials)
    return tok


def _save(tmp_path, tok, config=None, special_map=None, name="tok"):
    """A model directory: ``tokenizer.json`` (+ ``tokenizer_config.json``, ``special_tokens_map.json``)."""
    d = tmp_path / name
    d.mkdir()
    tok.save(str(d / "tokenizer.json"))
    if config is not None:
        (d / "tokenizer_config.json").write_text(json.dumps(config))
    if special_map is not None:
        (d / "special_tokens_map.json").write_text(json.dumps(special_map))
    return d


def _config(*overrides):
    with initialize_config_module(config_module="lcx.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


# -- encoding ------------------------------------------------------------------------------------


def test_round_trip_and_batch_equals_per_document(tmp_path):
    tok = HFTokenizer(_save(tmp_path, _bpe()) / "tokenizer.json")
    assert tok.vocab_size == 300 and (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (None, None, False, False)
    texts = [*TEXTS, "text it never saw: Ωμέγα ∞ 🚀", ""]
    batch = tok.encode_batch(texts)
    for s, ids in zip(texts, batch):
        one = tok.encode(s)
        assert ids.dtype == np.int32 and one.dtype == np.int32
        np.testing.assert_array_equal(ids, one)
        assert tok.decode(ids) == s  # byte-level: every text round-trips
        assert ids.size == 0 or (ids.min() >= 0 and ids.max() < tok.vocab_size)
    assert sum(b.size for b in batch) < sum(len(s.encode()) for s in texts)  # merges happened
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 299\]"):
        tok.decode([300])


def test_byte_tokenizer_has_no_bos_or_eos():
    tok = get_tokenizer("byte")
    docs = tok.encode_documents(["ab", "", "ü"])
    assert [d.tolist() for d in docs] == [[97, 98], [], [195, 188]]
    assert get_tokenizer("byte", add_bos=False, add_eos=False).encode_documents(["a"])[0].tolist() == [97]
    with pytest.raises(ValueError, match=r"data.add_bos=true, but data.tokenizer=byte has no BOS token"):
        get_tokenizer("byte", add_bos=True)
    with pytest.raises(ValueError, match=r"data.add_eos=true, but data.tokenizer=byte has no EOS token"):
        ByteTokenizer(add_eos=True)
    with pytest.raises(ValueError, match=r"data.add_bos=true, but data.tokenizer=byte has no BOS token"):
        run_config(_config("data.add_bos=true"))  # at the config edge


def test_post_processor_bos_is_added_once(tmp_path):
    """Llama 3's tokenizer.json: the post-processor adds the BOS; lcx encodes without it and adds
    it by id: exactly one, the same ids as the library with add_special_tokens=True."""
    raw = _bpe(post=f"{BOS} $A")
    tok = HFTokenizer(_save(tmp_path, raw) / "tokenizer.json")
    bos = raw.token_to_id(BOS)
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (bos, None, True, False)
    for s, doc in zip(TEXTS, tok.encode_documents(TEXTS)):
        assert doc.tolist() == raw.encode(s, add_special_tokens=True).ids
        assert doc[0] == bos and bos not in doc[1:].tolist()
        np.testing.assert_array_equal(doc[1:], tok.encode(s))
    assert tok.encode_documents([""])[0].size == 0  # an empty text is no document
    # overrides: data.add_bos=false drops it, data.add_eos=true needs an EOS token the files name
    assert tok.encode_documents(["x"])[0][0] == bos
    off = HFTokenizer(tmp_path / "tok", add_bos=False)
    np.testing.assert_array_equal(off.encode_documents(["x"])[0], tok.encode("x"))
    with pytest.raises(ValueError, match=r"data.add_eos=true, but data.tokenizer=.* has no EOS token"):
        HFTokenizer(tmp_path / "tok" / "tokenizer.json", add_eos=True)


def test_bos_eos_rules_from_tokenizer_config_and_overrides(tmp_path):
    raw = _bpe(post=f"{BOS} $A {EOS}")
    bos, eos = raw.token_to_id(BOS), raw.token_to_id(EOS)
    config = {"bos_token": BOS, "eos_token": {"content": EOS, "__type": "AddedToken"}}
    d = _save(tmp_path, raw, {**config, "add_bos_token": True, "add_eos_token": True})
    tok = HFTokenizer(d)
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (bos, eos, True, True)
    ids = tok.encode("x").tolist()
    assert tok.encode_documents(["x"])[0].tolist() == [bos, *ids, eos]
    for add_bos, add_eos, want in [
        (False, None, [*ids, eos]),
        (None, False, [bos, *ids]),
        (False, False, ids),
        (True, True, [bos, *ids, eos]),
    ]:
        got = get_tokenizer(str(d), add_bos=add_bos, add_eos=add_eos).encode_documents(["x"])[0]
        assert got.tolist() == want, (add_bos, add_eos)
    # a flag that disagrees with the post-processor: transformers 4 and 5 would differ; refused
    bad = _save(tmp_path, raw, {**config, "add_eos_token": False}, name="disagree")
    with pytest.raises(ValueError, match=r"add_eos_token=false, but the post-processor .* adds EOS 1 after"):
        HFTokenizer(bad)
    assert HFTokenizer(bad, add_eos=False).encode_documents(["x"])[0].tolist() == [bos, *ids]  # the way out
    # no post-processor, the flags and tokens from the config files (special_tokens_map.json too)
    plain = _bpe()
    d2 = _save(tmp_path, plain, {"add_bos_token": False}, {"bos_token": BOS, "eos_token": EOS}, name="map")
    t2 = HFTokenizer(d2)
    assert (t2.bos_id, t2.eos_id, t2.add_bos, t2.add_eos) == (bos, eos, False, False)
    assert HFTokenizer(d2, add_eos=True).encode_documents(["x"])[0].tolist() == [*ids, eos]
    with pytest.raises(ValueError, match=r"add_bos_token=true, but the post-processor .* does not add BOS"):
        HFTokenizer(_save(tmp_path, plain, {"bos_token": BOS, "add_bos_token": True}, name="flag_only"))
    # the two config files must agree on a token
    clash = _save(tmp_path, plain, {"bos_token": BOS}, {"bos_token": EOS}, name="clash")
    with pytest.raises(ValueError, match=r"special_tokens_map.json names bos_token='<\|end_of_text\|>'"):
        HFTokenizer(clash)
    # a token the vocabulary lacks
    with pytest.raises(ValueError, match=r"names the special token '<s>', which its vocabulary lacks"):
        HFTokenizer(_save(tmp_path, plain, {"bos_token": "<s>"}, name="nosuch"))


def test_a_post_processor_adding_two_tokens_needs_an_explicit_rule(tmp_path):
    raw = _bpe(post=f"{BOS} <|sys|> $A", extra_special=("<|sys|>",))
    d = _save(tmp_path, raw)
    with pytest.raises(ValueError, match=r"the post-processor adds ids \[0, 2\] before each text, not one BOS"):
        HFTokenizer(d)
    assert HFTokenizer(d, add_bos=False).encode_documents(["x"])[0].tolist() == raw.encode("x").ids[2:]


def test_file_alone_ignores_its_siblings_directory_reads_them(tmp_path):
    raw = _bpe(post=f"{BOS} $A")
    d = _save(tmp_path, raw, {"bos_token": BOS, "eos_token": EOS})
    assert HFTokenizer(d / "tokenizer.json").eos_id is None  # the file alone: the post-processor only
    assert HFTokenizer(d).eos_id == raw.token_to_id(EOS)  # the directory: its tokenizer_config.json too


# -- bad input -------------------------------------------------------------------------------------


def test_bad_tokenizer_paths_are_refused_naming_the_path(tmp_path):
    with pytest.raises(
        ValueError, match=r"unknown tokenizer 'bpe'; set data.tokenizer to one of \['byte', 'stdlib_bpe'\]"
    ):
        get_tokenizer("bpe")
    missing = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(FileNotFoundError, match=rf"no such file or directory \({missing}\)"):
        get_tokenizer(str(missing))
    empty = tmp_path / "model"
    empty.mkdir()
    (empty / "tokenizer.model").write_bytes(b"\x00")
    with pytest.raises(FileNotFoundError, match=rf"the directory {empty} holds no tokenizer.json .*tokenizer.model"):
        get_tokenizer(str(empty))
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"vocab_size": 256, "hidden_size": 64}))
    with pytest.raises(ValueError, match=rf"{cfg} is not a Hugging Face tokenizer.json: it has no 'model' object"):
        get_tokenizer(str(cfg))
    text = tmp_path / "notes.json"
    text.write_text("not json at all")
    with pytest.raises(ValueError, match=rf"{text} is not a JSON file"):
        get_tokenizer(str(text))
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"model": {"type": "NoSuchModel"}}))
    with pytest.raises(ValueError, match=rf"{broken} is not a tokenizer.json that tokenizers .* reads"):
        get_tokenizer(str(broken))
    # at the config edge, before any device starts or anything compiles
    with pytest.raises(FileNotFoundError, match=r"data.tokenizer='/nonexistent/tok.json': no such file"):
        run_config(_config("data.tokenizer=/nonexistent/tok.json"))
    with pytest.raises(ValueError, match=r"unknown tokenizer 'gpt5'"):
        run_config(_config("data.tokenizer=gpt5"))


# -- the model's vocabulary ------------------------------------------------------------------------


def test_vocab_is_the_tokenizers_padded_to_128(tmp_path):
    assert [padded_vocab_size(n) for n in (1, 128, 129, 256, 300, 4096, 50257, 128256)] == [
        128,
        128,
        256,
        256,
        384,
        4096,
        50304,
        128256,
    ]
    assert run_config(_config()).model.vocab_size == 256  # the default run: byte, unchanged
    assert run_config(_config("data=stdlib_bpe")).model.vocab_size == 4096
    d = _save(tmp_path, _bpe())  # 300 ids
    assert run_config(_config(f"data.tokenizer={d}")).model.vocab_size == 384
    # an explicit vocabulary is kept when it holds the tokenizer's ids
    assert run_config(_config(f"data.tokenizer={d}", "model.vocab_size=300")).model.vocab_size == 300
    assert run_config(_config("model=llama3_1_8b", "data=stdlib_bpe")).model.vocab_size == 128256


def test_a_too_small_vocab_is_refused_before_compiling(tmp_path, devices, monkeypatch):
    msg = r"model.vocab_size=256 \(model=tiny\) is smaller than data.tokenizer=stdlib_bpe's 4096 ids .*model.vocab_size=null"
    with pytest.raises(ValueError, match=msg):
        run_config(_config("data=stdlib_bpe", "model.vocab_size=256"))
    d = _save(tmp_path, _bpe())
    with pytest.raises(
        ValueError, match=r"model.vocab_size=256 .* 300 ids \(largest id 299\).*padded .*: 384\) or any value >= 300"
    ):
        run_config(_config(f"data.tokenizer={d}", "model.vocab_size=256"))
    # a RunConfig built in code is refused by setup, after the data, before any step is built
    import lcx.training.preflight as preflight

    config = run_config(_config("data=stdlib_bpe", "train.seq_len=256", "train.global_batch=2"))
    small = config.replace(model=config.model.replace(vocab_size=256))
    monkeypatch.setattr(preflight, "make_steps", lambda *a, **k: pytest.fail("built the steps"))
    with pytest.raises(ValueError, match=msg):
        preflight.setup(small, devices)
    check_model_vocab(4096, get_tokenizer("stdlib_bpe"))  # equal is enough


# -- the embedded BPE ------------------------------------------------------------------------------


def test_embedded_bpe_is_the_committed_file_and_compresses_the_validation_split():
    path = pathlib.Path(str(importlib.resources.files("lcx.data") / STDLIB_BPE))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == STDLIB_BPE_SHA256
    tok = get_tokenizer("stdlib_bpe")
    assert isinstance(tok, HFTokenizer) and tok.name == "stdlib_bpe"
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (4096, 0, 1, True, True)
    docs = [d for d in stdlib_corpus().documents if d]
    _, val_idx = split_documents(len(docs), 0.02, 0)
    val = [docs[i] for i in val_idx]
    ids = tok.encode_batch(val)
    assert [tok.decode(x) for x in ids] == val
    # the numbers docs/tokenizers.md quotes: 183,941 bytes -> 54,837 tokens (3.354 bytes per token)
    assert (sum(len(d.encode()) for d in val), sum(x.size for x in ids)) == (183941, 54837)
    # data=stdlib_bpe: each document framed by <|bos|> ... <|eos|>, the same documents as data=stdlib
    data = make_data(run_config(_config("data=stdlib_bpe")).data, seq_len=256, global_batch=2)
    byte = make_data(run_config(_config()).data, seq_len=256, global_batch=2)
    assert data.train.packer.num_docs == byte.train.packer.num_docs
    assert data.tokenizer.vocab_size == 4096 and int(next(data.train)["tokens"].max()) < 4096


def test_embedded_bpe_ships_in_the_wheel():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["lcx.data"]
    assert any(fnmatch.fnmatch(STDLIB_BPE, pattern) for pattern in data), data


@pytest.mark.slow
def test_embedded_bpe_regenerates_bit_for_bit():
    import subprocess
    import sys

    import tokenizers

    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        from make_stdlib_bpe import GENERATED_WITH
    finally:
        sys.path.pop(0)
    if tokenizers.__version__ != GENERATED_WITH:
        pytest.skip(f"the file was made by tokenizers {GENERATED_WITH}, this is {tokenizers.__version__}")
    r = subprocess.run(
        [sys.executable, "experiments/make_stdlib_bpe.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0 and "identical" in r.stdout, r.stdout + r.stderr[-2000:]


# -- parity with transformers ---------------------------------------------------------------------


@pytest.mark.parametrize("case", ["llama3_style", "bos_eos_flags", "gpt2_style", "llama2_style"])
def test_ids_equal_transformers_autotokenizer(case):
    """tests/fixtures/hf_tokenizer_parity/ids.json: transformers' AutoTokenizer's ids (BOS/EOS
    included), made by experiments/make_tokenizer_parity.py."""
    fixture = json.loads((PARITY / "ids.json").read_text())
    tok = get_tokenizer(str(PARITY / case))
    got = [d.tolist() for d in tok.encode_documents(fixture["texts"])]
    assert got == fixture["input_ids"][case]


# -- end to end ------------------------------------------------------------------------------------


def test_two_training_steps_on_the_embedded_bpe(tmp_path, devices):
    import jax

    from lcx.training.loop import train

    cfg = _config(
        "data=stdlib_bpe",
        "model=tiny",
        "train.seq_len=256",
        "train.steps=2",
        "train.eval_every=0",
        "checkpoint.dir=null",
    )
    config = run_config(cfg)
    assert config.model.vocab_size == 4096
    with jax.numpy_dtype_promotion("standard"):  # optax's bias correction: float ** int32 step
        out = train(config, tmp_path, devices)
    assert len(out.losses) == 2 and all(np.isfinite(out.losses))
    # a fresh model's loss is about ln(V): the 4,096-way head is in use, not 256
    assert abs(out.losses[0] - np.log(4096)) < 1.0, out.losses
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
