"""``python -m lcx.export checkpoint.dir=D out=DIR``: a 1-step training checkpoint (sliding window
model, so MistralForCausalLM) exported with several shards imports back as the checkpoint's
parameters bit for bit; the run's tokenizer files travel with it; bad configurations and an
inexpressible layer pattern are refused before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import numpy as np
import pytest
from _checkpoints import compose as _compose
from _checkpoints import train_tiny

from lcx.config import export_query
from lcx.data.tokenizers import get_tokenizer
from lcx.export import run_export, tokenizer_files
from lcx.models.hf import load_hf_llama
from lcx.sharding import Plan, bind
from lcx.training.resume import checkpoint_run, load_model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, devices):
    return train_tiny(tmp_path_factory.mktemp("export"), devices, ["model.sliding_window=64", "plan=allgather"])


def test_export_of_a_checkpoint_imports_bitwise(checkpoint, tmp_path, devices):
    out = tmp_path / "hf"
    q = export_query(
        _compose("export_config", [f"checkpoint.dir={checkpoint}", f"out={out}", "export.max_shard_bytes=100000"])
    )
    assert q.out == out and q.export.dtype is None
    run_export(q, devices)
    hf = json.loads((out / "config.json").read_text())
    assert hf["architectures"] == ["MistralForCausalLM"] and hf["sliding_window"] == 64
    tok = get_tokenizer(checkpoint_run(checkpoint)[1]["data"]["tokenizer"])
    assert (hf["bos_token_id"], hf["eos_token_id"]) == (tok.bos_id, tok.eos_id)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    mp = bind(Plan(mesh=(("data", -1),), activations={"batch": "data"}), devices[:1])
    original, _ = load_model(checkpoint, mp)
    back, cfg = load_hf_llama(out, mp)
    assert cfg.sliding_window == 64
    for a, b in zip(jax.tree.leaves(original), jax.tree.leaves(back), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_tokenizer_files(tmp_path):
    assert tokenizer_files({"tokenizer": "byte"}) == [] and tokenizer_files(None) == []
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert [p.name for p in tokenizer_files({"tokenizer": str(tmp_path)})] == [
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert tokenizer_files({"tokenizer": str(tmp_path / "tokenizer.json")}) == [tmp_path / "tokenizer.json"]
    with pytest.raises(FileNotFoundError, match="gone.json"):
        tokenizer_files({"tokenizer": str(tmp_path / "gone.json")})


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["out=x"], "needs a checkpoint"),
        (["checkpoint.dir=x"], "needs out="),
        (["checkpoint.dir=x", "out=y", "export.dtype=float16"], "export.dtype='float16'"),
        (["checkpoint.dir=x", "out=y", "export.max_shard_bytes=0"], "max_shard_bytes=0"),
    ],
)
def test_bad_configs_are_refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        export_query(_compose("export_config", overrides))


def test_command_line_refuses_a_misspelt_key(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "lcx.export", "checkpoint.dri=x", "out=y"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert p.returncode == 2, p.stderr[-2000:]
    assert "checkpoint.dri: unknown key; did you mean checkpoint.dir?" in p.stderr
