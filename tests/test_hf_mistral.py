"""Parity with transformers, both directions, from committed fixtures (no torch needed):

- import: random transformers MistralForCausalLM (window 8 on 64 tokens, GQA) and tied
  LlamaForCausalLM (experiments/make_hf_mistral_fixture.py) give transformers' logits;
- export: lcx's export of seeded models (experiments/hf_export_roundtrip.py) is byte-identical to
  the committed files that transformers loaded, and lcx's logits equal transformers' logits of
  them (the committed ``transformers_logits.npy``; the run's numbers in lcx_export_parity.json).
"""

from __future__ import annotations

import importlib.util
import json
import pathlib

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

import lcx.models as lm
from lcx.models.hf import load_hf_llama
from lcx.sharding import Plan, bind

FIX = pathlib.Path(__file__).parent / "fixtures"
ROOT = pathlib.Path(__file__).parent.parent
ONE = Plan(mesh=(("data", -1),), activations={"batch": "data"})
TOL = 5e-5  # x max|logit|: float32 rounding; a wrong detail (window off by one, no window) is > 1e-2


def _roundtrip_script():
    spec = importlib.util.spec_from_file_location(
        "hf_export_roundtrip", ROOT / "experiments" / "hf_export_roundtrip.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _logits(model, mp, d: pathlib.Path) -> np.ndarray:
    tok, pos = (jnp.asarray(np.load(d / f)) for f in ("tokens.npy", "positions.npy"))
    return np.asarray(eqx.filter_jit(lambda m, t, p: m(t, p, jnp.zeros_like(t), plan=mp))(model, tok, pos))


@pytest.mark.parametrize("name", ["hf_tiny_mistral", "hf_tiny_llama_tied"])
def test_import_matches_transformers(devices, name):
    d = FIX / name
    mp = bind(ONE, devices[:1])
    model, cfg = load_hf_llama(d, mp)
    ref = np.load(d / "logits.npy")
    got = _logits(model, mp, d)
    # measured max |got - ref| / max|ref|: 1.1e-6 (mistral, of 4.85), 1.0e-6 (llama tied, of 4.15);
    # the mistral without its window: 1.35, with window 9: 1.07
    np.testing.assert_allclose(got, ref, rtol=0, atol=TOL * np.abs(ref).max())
    if name == "hf_tiny_mistral":
        assert cfg.layer_kinds == (lm.LayerKind("sliding", window=8, sinks=False),) * 2
        # the window matters: without it (or one token wider) the late positions are far off
        for w in (None, 9):
            other, _ = load_hf_llama(d, mp, sliding_window=w)
            assert np.abs(_logits(other, mp, d) - ref).max() > 1e-2 * np.abs(ref).max()
    else:
        assert cfg.tie_embeddings and model.head is None


@pytest.mark.parametrize("case", ["llama_tied", "mistral", "qwen2", "qwen3", "gemma3"])
def test_export_is_what_transformers_loaded(tmp_path, devices, case):
    rt = _roundtrip_script()
    committed = FIX / f"lcx_export_{case}"
    model = rt.seeded_model(case)
    lm.save_pretrained(model, tmp_path)
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["config.json", "model.safetensors"]
    for f in written:
        assert (tmp_path / f).read_bytes() == (committed / f).read_bytes(), f
    mp = bind(ONE, devices[:1])
    back, _ = load_hf_llama(committed, mp)
    ref = np.load(committed / "transformers_logits.npy")
    got = _logits(back, mp, committed)
    np.testing.assert_allclose(got, ref, rtol=0, atol=TOL * np.abs(ref).max())
    parity = json.loads((FIX / "lcx_export_parity.json").read_text())["models"][case]
    classes = {"mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "gemma3": "Gemma3"}
    assert parity["class"] == classes.get(case, "Llama") + "ForCausalLM"
    assert json.loads((committed / "config.json").read_text())["architectures"] == [parity["class"]]
    assert parity["relative"] < TOL
