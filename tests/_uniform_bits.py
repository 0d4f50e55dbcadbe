"""Bitwise fingerprints of uniform (one-kind) tiny models: loss, logits and every gradient leaf.

Recorded once from the code before layer kinds existed (``tests/fixtures/uniform_model_bits.json``)
and checked by ``tests/test_uniform_bits.py``: a uniform model must remain exactly today's program
after the forward learnt to scan over pattern periods. Each array is fingerprinted by the exact
float hex of its float64 sum and the first 16 hex digits of the SHA-256 of its bytes (a one-ULP
change anywhere changes the digest).

XLA's CPU code differs between JAX versions and instruction sets (fused multiply-adds round
differently), so the fixture holds one record per environment (:func:`environment`); the test
compares with the record of its own environment, if there is one.

Regenerate (only when a change of the uniform program is intended, and say so in the commit)::

    PYTHONPATH=. python tests/_uniform_bits.py
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import platform
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "uniform_model_bits.json"


def configs():
    """The uniform configs, by name: the tiny preset and one change each."""
    import lcx.models as lm

    tiny = lm.preset("tiny")
    return {
        "plain": tiny,
        "sliding_window": tiny.replace(sliding_window=8),
        "attention_sinks": tiny.replace(attention_sinks=True),
        "rope_llama3": tiny.replace(rope_scaling_type="llama3", rope_scaling_factor=8.0, rope_original_max_len=16),
        "rope_yarn": tiny.replace(rope_scaling_type="yarn", rope_scaling_factor=4.0, rope_original_max_len=16),
        "tie_embeddings": tiny.replace(tie_embeddings=True),
        "no_document_mask": tiny.replace(document_mask=False),
        "remat_dots_saveable": tiny.replace(remat="dots_saveable"),
    }


RING_CONFIG = "sliding_window_sinks"
"""The config also fingerprinted under a ring plan on 8 devices (contiguous layout)."""


def ring_config():
    import lcx.models as lm

    return lm.preset("tiny").replace(sliding_window=8, attention_sinks=True)


def inputs(vocab: int):
    """tokens, positions, segment ids int32 ``[2, 32]``: two packed rows (documents 20 + 12, 32)."""
    rng = np.random.default_rng(0)
    rows = [[20, 12], [32]]
    pos = np.array([np.concatenate([np.arange(n) for n in r]) for r in rows], np.int32)
    seg = np.array([np.concatenate([np.full(n, i) for i, n in enumerate(r)]) for r in rows], np.int32)
    tok = rng.integers(0, vocab, pos.shape).astype(np.int32)
    return jnp.asarray(tok), jnp.asarray(pos), jnp.asarray(seg)


def plans():
    """The one-device plan and the 8-device ring plan (contiguous, blocks of 4 tokens)."""
    from lcx.sharding import AttentionConfig, Plan, bind

    one = bind(Plan(mesh=(("data", -1),), activations={"batch": "data"}), jax.devices()[:1])
    ring = bind(
        Plan(
            mesh=(("context", 8),),
            activations={"seq": ("context",)},
            attention=AttentionConfig(strategy="ring", layout="contiguous", block_q=4, block_kv=4),
        ),
        jax.devices()[:8],
    )
    return one, ring


def fingerprint(a) -> dict[str, str]:
    a = np.asarray(a)
    return {
        "sum": float(np.sum(a, dtype=np.float64)).hex(),
        "sha256": hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16],
    }


def record(cfg, plan) -> dict:
    """Fingerprints of the loss (mean next-token cross entropy), the logits and every gradient."""
    import lcx.models as lm

    model = lm.init_model(cfg, key=jax.random.key(0))
    tok, pos, seg = inputs(cfg.vocab_size)

    def loss(m):
        logits = m(tok, pos, seg, plan=plan)
        targets = jnp.roll(tok, -1, axis=1)
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)
        return jnp.mean(nll), logits

    (value, logits), grads = eqx.filter_jit(eqx.filter_value_and_grad(loss, has_aux=True))(model)
    leaves = jax.tree_util.tree_flatten_with_path(grads)[0]
    return {
        "loss": float(value).hex(),
        "logits": fingerprint(logits),
        "grads": {jax.tree_util.keystr(p): fingerprint(g) for p, g in leaves},
    }


def environment() -> str:
    """The JAX version and CPU instruction set the bits depend on."""
    import jaxlib

    flags = ""
    try:
        flags = next(
            (ln for ln in pathlib.Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), ""
        )
    except OSError:
        pass
    isa = "avx512f" if " avx512f" in flags else "avx2" if " avx2" in flags else "other"
    if " amx_tile" in flags:  # XLA's CPU kernels differ on AMX machines (Sapphire Rapids and later)
        isa += "+amx"
    return f"jax {jax.__version__} jaxlib {jaxlib.__version__} {platform.machine()} {isa}"


def all_records() -> dict:
    one, ring = plans()
    out = {name: record(cfg, one) for name, cfg in configs().items()}
    out[f"ring8_{RING_CONFIG}"] = record(ring_config(), ring)
    return out


def main() -> None:
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    import conftest  # noqa: F401  (8 devices, highest matmul precision, strict promotion: as the tests)

    data = json.loads(FIXTURE.read_text()) if FIXTURE.exists() else {}
    data[environment()] = all_records()
    FIXTURE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE} [{environment()}]")


if __name__ == "__main__":
    main()
