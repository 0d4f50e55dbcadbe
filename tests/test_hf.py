"""Hugging Face Llama import: logits of a random 2-layer transformers model (committed fixture,
tests/fixtures/hf_tiny_llama, made by experiments/make_hf_fixture.py) are reproduced with plain,
Llama 3.1 and YaRN RoPE, on one device and sharded FSDP over 8; each device reads only its
slice; single-file and bfloat16 checkpoints; config mapping; refusals. Needs no torch.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

import lcx.models as lm
from lcx.models import hf
from lcx.models.hf import HFImportError, hf_config, load_hf_llama
from lcx.sharding import Plan, bind

FIX = pathlib.Path(__file__).parent / "fixtures" / "hf_tiny_llama"
FSDP = Plan(mesh=(("fsdp", 8),), params={"embed": "fsdp"}, activations={"batch": ()})
ONE = Plan(mesh=(("data", -1),), activations={"batch": "data"})


def checkpoint(tmp_path: pathlib.Path, variant: str = "default") -> pathlib.Path:
    """The fixture's shards with the config of ``variant`` in a directory of their own."""
    d = tmp_path / variant
    d.mkdir()
    for f in FIX.glob("model*"):
        (d / f.name).symlink_to(f)
    shutil.copy(FIX / ("config.json" if variant == "default" else f"config_{variant}.json"), d / "config.json")
    return d


def logits(model, mp):
    tok, pos = (jnp.asarray(np.load(FIX / f)) for f in ("tokens.npy", "positions.npy"))
    return np.asarray(eqx.filter_jit(lambda m, t, p: m(t, p, jnp.zeros_like(t), plan=mp))(model, tok, pos))


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["default", "llama3", "yarn"])
@pytest.mark.parametrize("plan", ["one", "fsdp8"])
def test_logits_match_transformers(tmp_path, devices, variant, plan):
    mp = bind(ONE, devices[:1]) if plan == "one" else bind(FSDP, devices)
    model, cfg = load_hf_llama(checkpoint(tmp_path, variant), mp)
    assert cfg.rope_scaling_type == (None if variant == "default" else variant)
    assert cfg.rope.attention_scaling == pytest.approx(1 + 0.1 * np.log(4.0) if variant == "yarn" else 1.0)
    for leaf, sh in zip(jax.tree.leaves(model), jax.tree.leaves(lm.model_shardings(model, mp)), strict=True):
        assert leaf.sharding == sh and leaf.dtype == jnp.float32
    ref = np.load(FIX / f"logits_{variant}.npy")
    got = logits(model, mp)
    assert got.shape == ref.shape == (2, 24, 256)
    # Both sides round: the reference (transformers in float64) forms its RoPE phases in float32
    # and differs from a float64 NumPy port by 7.6e-6; lcx in float32 differs from that port by
    # 7.5e-6 (logits up to 6.3; weights std 0.2 amplify rounding). Measured max |got - ref|:
    # 1.5e-5 / 2.0e-5 / 2.0e-5 on one device, 1.0e-5 / 1.1e-5 / 1.3e-5 under FSDP 8.
    np.testing.assert_allclose(got, ref, rtol=0, atol=5e-6 * np.abs(ref).max())


def test_each_device_reads_only_its_slice(tmp_path, devices, monkeypatch):
    reads = []
    orig = hf._Files.read

    def spy(self, name, index):
        out = orig(self, name, index)
        reads.append((name, out.size))
        return out

    monkeypatch.setattr(hf._Files, "read", spy)
    load_hf_llama(checkpoint(tmp_path), bind(FSDP, devices))
    with safe_open(FIX / "model-00001-of-00002.safetensors", "numpy") as f:
        full_q = f.get_slice("model.layers.0.self_attn.q_proj.weight").get_shape()
    q = [n for name, n in reads if name == "model.layers.0.self_attn.q_proj.weight"]
    # 8 devices, each the [N*H, D/8] column block of its shard: never the whole tensor
    assert q == [full_q[0] * full_q[1] // 8] * 8
    assert max(n for _, n in reads) <= 256 * 64 // 8  # largest: a vocab x D/8 block
    assert "torch" not in sys.modules and "transformers" not in sys.modules


def test_single_file_bfloat16_checkpoint(tmp_path, devices):
    """One model.safetensors (no index) in bfloat16 loads to the bf16-rounded float32 weights."""
    tensors = {}
    for f in FIX.glob("*.safetensors"):
        with safe_open(f, "numpy") as h:
            tensors.update({k: h.get_tensor(k).astype(jnp.bfloat16) for k in h.keys()})
    d = tmp_path / "bf16"
    d.mkdir()
    save_file(tensors, d / "model.safetensors")
    shutil.copy(FIX / "config.json", d / "config.json")
    mp = bind(FSDP, devices)
    bf, _ = load_hf_llama(d, mp)
    f32, _ = load_hf_llama(checkpoint(tmp_path), mp)
    for a, b in zip(jax.tree.leaves(bf), jax.tree.leaves(f32), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b).astype(jnp.bfloat16).astype(np.float32))
    stored, _ = load_hf_llama(d, mp, param_dtype="bfloat16", dtype="bfloat16")
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(stored))


META_LLAMA31_8B = {  # config.json of meta-llama/Llama-3.1-8B (transformers 4.43 format)
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}


def test_config_mapping_llama31_8b_equals_the_preset():
    cfg = hf_config(META_LLAMA31_8B, dtype="bfloat16", remat="full", name="llama3_1_8b")
    assert cfg == lm.preset("llama3_1_8b")
    yarn = hf_config(
        {
            **META_LLAMA31_8B,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32768,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
        }
    )
    assert yarn.rope_scaling_type == "yarn" and yarn.rope_original_max_len == 32768
    assert yarn.rope_attention_factor == 1.0  # mscale / mscale_all_dim, DeepSeek-style
    derived = hf_config(
        {
            **META_LLAMA31_8B,
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "original_max_position_embeddings": 32768},
        }
    )
    assert derived.rope_scaling_factor == 4.0 and derived.rope_theta == 1e6  # 131072 / 32768


@pytest.mark.parametrize(
    "change, words",
    [
        ({"attention_bias": True}, ["attention_bias", "biases"]),
        ({"hidden_act": "gelu"}, ["hidden_act", "silu"]),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, ["'dynamic'", "llama3", "yarn"]),
        ({"model_type": "mistral"}, ["mistral", "llama"]),
    ],
)
def test_unsupported_configs_are_refused(change, words):
    with pytest.raises(HFImportError) as e:
        hf_config({**META_LLAMA31_8B, **change})
    for w in words:
        assert w in str(e.value)


def test_missing_and_misshapen_tensors_are_refused_before_reading(tmp_path, devices):
    d = checkpoint(tmp_path)
    index = json.loads((FIX / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.layers.1.mlp.up_proj.weight"]
    (d / "model.safetensors.index.json").unlink()
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(HFImportError, match="missing.*model.layers.1.mlp.up_proj.weight"):
        load_hf_llama(d, bind(ONE, devices[:1]))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(
        json.dumps({**json.loads((FIX / "config.json").read_text()), "intermediate_size": 96})
    )
    for f in FIX.glob("model*"):
        (bad / f.name).symlink_to(f)
    with pytest.raises(
        HFImportError, match=r"gate_proj.weight has shape \[128, 64\] but config.json implies \[96, 64\]"
    ):
        load_hf_llama(bad, bind(ONE, devices[:1]))
