"""Hugging Face export (lcx.models.save_pretrained): import of an export is the original bit for
bit (tied and untied, GQA, Llama 3.1 RoPE, a Mistral window model); the shard split and index;
strict config.json keys and Mistral mapping on import; refusals. Needs no torch (the
transformers side: tests/test_hf_mistral.py and experiments/make_hf_mistral_fixture.py).
"""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
import pytest
from safetensors import safe_open

import lcx.models as lm
from lcx.models.hf import load_hf_llama
from lcx.models.hf_config import HFExportError, HFImportError, hf_config
from lcx.models.hf_export import to_hf_config
from lcx.models.kinds import parse_layer_pattern
from lcx.sharding import Plan, bind

ONE = Plan(mesh=(("data", -1),), activations={"batch": "data"})
BASE = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=48)
CASES = {
    "untied_gqa": {},
    "tied": {"tie_embeddings": True},
    "llama3_rope": {"rope_scaling_type": "llama3", "rope_scaling_factor": 8.0, "rope_original_max_len": 64},
    "mistral_window": {"sliding_window": 16, "n_kv_heads": 1},
}


def _model(**kw):
    cfg = lm.ModelConfig(**{**BASE, **kw})
    return lm.init_model(cfg, key=jax.random.key(3)), cfg


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_of_export_is_the_original_bitwise(tmp_path, devices, case):
    model, cfg = _model(**CASES[case])
    lm.save_pretrained(model, tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["architectures"] == ["MistralForCausalLM" if case == "mistral_window" else "LlamaForCausalLM"]
    back, cfg2 = load_hf_llama(tmp_path, bind(ONE, devices[:1]))
    for f in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim", "norm_eps"):
        assert getattr(cfg2, f) == getattr(cfg, f)
    assert (cfg2.tie_embeddings, cfg2.sliding_window, cfg2.rope) == (cfg.tie_embeddings, cfg.sliding_window, cfg.rope)
    a, b = jax.tree.leaves(model), jax.tree.leaves(back)
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    with safe_open(tmp_path / "model.safetensors", "numpy") as f:
        names = set(f.keys())
        assert f.metadata() == {"format": "pt"}
    assert ("lm_head.weight" in names) == (not cfg.tie_embeddings)
    assert f.get_slice  # noqa: B018 - opened above
    assert not (tmp_path / "model.safetensors.index.json").exists()


def test_small_shards_and_index(tmp_path, devices):
    model, _ = _model()
    lm.save_pretrained(model, tmp_path, max_shard_bytes=20_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    files = sorted({*index["weight_map"].values()})
    n = len(files)
    assert n >= 3 and files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    total = 0
    for fname in files:
        with safe_open(tmp_path / fname, "numpy") as f:
            keys = list(f.keys())
            size = sum(f.get_tensor(k).nbytes for k in keys)
        assert {k for k, v in index["weight_map"].items() if v == fname} == set(keys)
        # a shard over the limit holds one tensor (the 64 x 32 embedding is 8 KB: none here)
        assert size <= 20_000
        total += size
    assert index["metadata"]["total_size"] == total == 4 * sum(x.size for x in jax.tree.leaves(model))
    back, _ = load_hf_llama(tmp_path, bind(ONE, devices[:1]))
    for x, y in zip(jax.tree.leaves(model), jax.tree.leaves(back), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_bfloat16_export_and_tokenizer_files(tmp_path, devices):
    model, _ = _model(param_dtype="bfloat16")
    tok = tmp_path / "tokenizer.json"
    tok.write_text("{}")
    out = lm.save_pretrained(model, tmp_path / "out", tokenizer_files=[tok])
    assert (out / "tokenizer.json").read_text() == "{}"
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    back, _ = load_hf_llama(out, bind(ONE, devices[:1]), param_dtype="bfloat16")
    for x, y in zip(jax.tree.leaves(model), jax.tree.leaves(back), strict=True):
        assert y.dtype == x.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    with pytest.raises(FileNotFoundError, match="nope.json"):
        lm.save_pretrained(model, tmp_path / "x", tokenizer_files=[tmp_path / "nope.json"])


@pytest.mark.parametrize(
    "kw, words",
    [
        (
            {"layer_pattern": ({"kind": "sliding", "window": 8}, {"kind": "global"})},
            ["mixes kinds", "'sliding'", "'window': 8"],
        ),
        ({"layer_pattern": ({"kind": "chunked", "chunk": 8},)}, ["'chunked'", "MistralForCausalLM"]),
        ({"layer_pattern": ({"kind": "global", "rope": False},)}, ["'rope': False"]),
        ({"attention_sinks": True}, ["'sinks': True"]),
    ],
)
def test_inexpressible_models_are_refused(kw, words):
    if "layer_pattern" in kw:
        kw = {"layer_pattern": parse_layer_pattern(list(kw["layer_pattern"]))}
    cfg = lm.ModelConfig(**{**BASE, **kw})
    with pytest.raises(HFExportError) as e:
        to_hf_config(cfg, torch_dtype="float32")
    for w in words:
        assert w in str(e.value)


LLAMA = json.loads((pathlib.Path(__file__).parent / "fixtures" / "hf_tiny_llama" / "config.json").read_text())


def test_every_key_of_the_fixture_config_is_known_and_exported_configs_import():
    hf_config(LLAMA)  # transformers 5.24's LlamaConfig: every key mapped, no-op or metadata
    for case in CASES.values():
        cfg = lm.ModelConfig(**{**BASE, **case})
        assert hf_config(to_hf_config(cfg, torch_dtype="float32")).rope == cfg.rope


@pytest.mark.parametrize(
    "change, words",
    [
        ({"sliding_window": 16}, ["model_type='llama'", "sliding_window=16", "mistral"]),
        ({"attention_dropout": 0.1}, ["attention_dropout=0.1", "0.0"]),
        ({"pretraining_tp": 2}, ["pretraining_tp=2"]),
        ({"mlp_bias": True}, ["mlp_bias=True"]),
        ({"qk_norm": True}, ["qk_norm=True", "not supported"]),
        ({"architectures": ["Qwen3ForCausalLM"]}, ["Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"]),
        ({"model_type": "qwen2"}, ["'qwen2'", "'llama'", "'mistral'"]),
        ({"model_type": "mistral"}, ["'mistral'", "LlamaForCausalLM"]),  # disagrees with architectures
    ],
)
def test_config_keys_are_mapped_no_op_or_refused(change, words):
    with pytest.raises(HFImportError) as e:
        hf_config({**LLAMA, **change})
    for w in words:
        assert w in str(e.value)


def test_mistral_window_maps_to_a_uniform_sliding_model():
    mistral = {**LLAMA, "architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 16}
    for k in ("attention_bias", "mlp_bias", "pretraining_tp"):
        del mistral[k]
    cfg = hf_config(mistral)
    assert cfg.sliding_window == 16 and cfg.layer_kinds == (lm.LayerKind("sliding", window=16, sinks=False),) * 2
    assert hf_config({**mistral, "sliding_window": None}).sliding_window is None


MISTRAL_7B_V01 = {  # config.json of mistralai/Mistral-7B-v0.1
    "architectures": ["MistralForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.34.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}


def test_mistral_7b_config_maps_and_round_trips():
    cfg = hf_config(MISTRAL_7B_V01)
    assert (cfg.d_model, cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.sliding_window) == (4096, 32, 8, 128, 4096)
    absent = {k: v for k, v in MISTRAL_7B_V01.items() if k != "sliding_window"}
    assert hf_config(absent).sliding_window == 4096  # transformers' MistralConfig default
    out = to_hf_config(cfg, torch_dtype="bfloat16", max_position_embeddings=32768, bos_token_id=1, eos_token_id=2)
    assert {k: out[k] for k in MISTRAL_7B_V01 if k in out} == {
        k: v for k, v in MISTRAL_7B_V01.items() if k in out and k != "transformers_version"
    }
    assert hf_config(out) == cfg
