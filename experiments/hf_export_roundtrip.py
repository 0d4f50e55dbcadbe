"""lcx -> safetensors -> transformers: export seeded lcx models with ``lcx.models.save_pretrained``,
load them with ``AutoModelForCausalLM.from_pretrained`` and compare logits.

Two steps, two environments (lcx does not depend on torch):

    # 1. lcx (jax) environment: writes tests/fixtures/lcx_export_{llama_tied,mistral}/ with the
    #    export, tokens.npy, positions.npy and lcx_logits.npy (float32, one CPU device)
    PYTHONPATH=. python experiments/hf_export_roundtrip.py export
    # 2. torch + transformers environment: writes transformers_logits.npy in each and
    #    tests/fixtures/lcx_export_parity.json (max |lcx - transformers| per model)
    /work/torchvenv/bin/python experiments/hf_export_roundtrip.py transformers

The models (:func:`seeded_model`) take their weights from NumPy's seeded generator, not from
``jax.random``, so the export is the same bytes under every jax version: tests/test_hf_mistral.py
re-exports them and compares with the committed files byte for byte, and checks lcx's logits of
the committed export against the committed transformers logits. ``llama_tied``: tied
embeddings, GQA 4:2, Llama 3.1 RoPE (factor 8, original length 32; positions reach 63).
``mistral``: untied, GQA 4:1, sliding window 8 on 24-token rows. ``qwen2``: q/k/v biases, GQA
4:2 (Qwen2ForCausalLM). ``qwen3``: QK-norm, tied, GQA 4:1 (Qwen3ForCausalLM). ``gemma3``: 3 layers
[sliding 8, sliding 8, global with RoPE base 1M and x4 linear scaling], Gemma's norms, GeGLU,
sqrt(d) embeddings, query_pre_attn_scalar 12, tied (Gemma3ForCausalLM).
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import numpy as np

FIX = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"
DIMS: dict[str, Any] = dict(vocab_size=96, d_model=32, n_layers=2, n_heads=4, head_dim=8, mlp_dim=64, norm_eps=1e-5)
CASES: dict[str, dict[str, Any]] = {
    "llama_tied": dict(
        n_kv_heads=2,
        tie_embeddings=True,
        rope_scaling_type="llama3",
        rope_scaling_factor=8.0,
        rope_original_max_len=32,
    ),
    "mistral": dict(n_kv_heads=1, sliding_window=8),
    "qwen2": dict(n_kv_heads=2, attention_bias=True),
    "qwen3": dict(n_kv_heads=1, qk_norm=True, tie_embeddings=True),
    "gemma3": dict(
        n_layers=3,
        n_kv_heads=2,
        tie_embeddings=True,
        qk_norm=True,
        norm_gain_offset=1.0,
        post_norms=True,
        mlp_activation="gelu_tanh",
        scale_embeddings=True,
        query_pre_attn_scalar=12.0,
        norm_eps=1e-6,
        layer_pattern=(
            {"kind": "sliding", "window": 8, "repeat": 2},
            {"kind": "global", "rope_theta": 1e6, "rope_scaling_type": "linear", "rope_scaling_factor": 4.0},
        ),
    ),
}


def inputs(vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """``tokens, positions``, int32 ``[2, 24]``; row 1 starts at position 40."""
    tokens = np.random.default_rng(7).integers(0, vocab, (2, 24)).astype(np.int32)
    return tokens, np.stack([np.arange(24), 40 + np.arange(24)]).astype(np.int32)


def seeded_model(case: str):
    """The lcx Llama of ``case`` with normal(0, 0.2) weights and 1 + 0.2 normal norm gains, drawn
    from ``np.random.default_rng(0)`` in parameter order (independent of jax's RNG)."""
    import jax
    import jax.numpy as jnp

    import lcx.models as lm

    cfg = lm.ModelConfig.from_dict({"name": case, **DIMS, **CASES[case]})
    abstract = jax.eval_shape(lambda: lm.init_model(cfg, key=jax.random.key(0)))
    rng = np.random.default_rng(0)
    paths, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    leaves = []
    for p, leaf in paths:
        x = rng.standard_normal(leaf.shape).astype(np.float32) * np.float32(0.2)
        if "norm" in jax.tree_util.keystr(p):  # gains 1 + 0.2 normal (Gemma stores gain - 1)
            x = x + np.float32(1.0 - cfg.norm_gain_offset)
        leaves.append(jnp.asarray(x))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def lcx_logits(model, directory_or_none=None) -> np.ndarray:
    """Logits ``[2, 24, V]`` float32 of ``model`` on :func:`inputs`, one device."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    from lcx.sharding import Plan, bind

    mp = bind(Plan(mesh=(("data", -1),), activations={"batch": "data"}), jax.devices()[:1])
    tok, pos = (jnp.asarray(a) for a in inputs(model.config.vocab_size))
    f = eqx.filter_jit(lambda m, t, p: m(t, p, jnp.zeros_like(t), plan=mp))
    return np.asarray(f(model, tok, pos), dtype=np.float32)


def export() -> None:
    import lcx.models as lm

    for case in CASES:
        out = FIX / f"lcx_export_{case}"
        model = seeded_model(case)
        lm.save_pretrained(model, out)
        tok, pos = inputs(model.config.vocab_size)
        np.save(out / "tokens.npy", tok)
        np.save(out / "positions.npy", pos)
        np.save(out / "lcx_logits.npy", lcx_logits(model))
        print("exported", out)


def transformers_side() -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    report: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__, "models": {}}
    for case in CASES:
        d = FIX / f"lcx_export_{case}"
        m = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").eval()
        m = m.double()
        tok, pos = np.load(d / "tokens.npy"), np.load(d / "positions.npy")
        with torch.no_grad():
            ref = m(input_ids=torch.from_numpy(tok).long(), position_ids=torch.from_numpy(pos).long()).logits
        ref = ref.float().numpy()
        np.save(d / "transformers_logits.npy", ref)
        got = np.load(d / "lcx_logits.npy")
        diff, scale = float(np.abs(got - ref).max()), float(np.abs(ref).max())
        report["models"][case] = {
            "class": type(m).__name__,
            "max_abs_diff": diff,
            "max_abs_logit": scale,
            "relative": diff / scale,
        }
        print(case, report["models"][case])
    (FIX / "lcx_export_parity.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    {"export": export, "transformers": transformers_side}[sys.argv[1]]()
