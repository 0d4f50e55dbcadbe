"""The per-token layers of the decoder: RMSNorm (model width and per head), the token embedding
and the gated MLP, with the family options they read (:class:`~lcx.models.config.ModelConfig`:
``norm_gain_offset``, ``mlp_activation``). Attention, the block and the model are in
:mod:`lcx.models.llama`.

Every parameter field is declared with :func:`lcx.models.params.param` metadata (logical axes and
role); every call runs under ``jax.named_scope`` (``lcx.RMSNorm``, ``lcx.HeadRMSNorm``,
``lcx.Embedding``, ``lcx.MLP``).
"""

from __future__ import annotations

import functools
import math
from typing import TypeAlias

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from lcx.models.config import ModelConfig
from lcx.models.params import param

INIT_STD = 0.02
"""Standard deviation of the normal initialisation of every weight matrix and the embedding."""

Hidden: TypeAlias = Float[Array, "B T D"]
"""The residual stream ``[B, T, D]`` a block reads and writes."""


def normal(key: PRNGKeyArray, shape: tuple[int, ...], std: float, dtype) -> Array:
    return std * jax.random.normal(key, shape, dtype)


def _rms_norm(x: Float[Array, "*b D"], weight: Float[Array, " D"], eps: float, offset: float) -> Float[Array, "*b D"]:
    """``x / rms(x) * (offset + weight)`` in float32, returned in ``x``'s dtype (Zhang & Sennrich
    2019, arXiv:1910.07467). The gain multiplies before the cast back (Gemma's order; transformers'
    Llama casts first, which gives the same bits for float32 inputs)."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + jnp.float32(eps))
    gain = weight.astype(jnp.float32)
    if offset:
        gain = jnp.float32(offset) + gain
    return (y * gain).astype(x.dtype)


class RMSNorm(eqx.Module):
    """Root-mean-square layer norm over the model width with a learned gain ``offset + w``
    (``offset`` is ``ModelConfig.norm_gain_offset``: 0 for Llama, 1 for Gemma's ``1 + w``).

    Computed in float32 whatever the input dtype; returns the input dtype. The gain starts at one
    (``w`` initialised to ``1 - offset``).
    """

    weight: Float[Array, " D"] = eqx.field(metadata=param("embed", role="norm"))
    eps: float = eqx.field(static=True)
    offset: float = eqx.field(static=True, default=0.0)

    def __init__(self, d_model: int, *, eps: float, offset: float = 0.0, dtype=jnp.float32):
        self.weight = jnp.full((d_model,), 1.0 - offset, dtype)
        self.eps = eps
        self.offset = offset

    def __call__(self, x: Float[Array, "*b D"]) -> Float[Array, "*b D"]:
        with jax.named_scope("lcx.RMSNorm"):
            return _rms_norm(x, self.weight, self.eps, self.offset)


class HeadRMSNorm(eqx.Module):
    """RMSNorm over each attention head's H features, one ``[H]`` gain shared by the heads (QK-norm:
    Qwen3's ``q_norm``/``k_norm``, Gemma 3's; Dehghani et al. 2023, arXiv:2302.05442). As
    :class:`RMSNorm` otherwise."""

    weight: Float[Array, " H"] = eqx.field(metadata=param("head_dim", role="norm"))
    eps: float = eqx.field(static=True)
    offset: float = eqx.field(static=True, default=0.0)

    def __init__(self, head_dim: int, *, eps: float, offset: float = 0.0, dtype=jnp.float32):
        self.weight = jnp.full((head_dim,), 1.0 - offset, dtype)
        self.eps = eps
        self.offset = offset

    def __call__(self, x: Float[Array, "*b H"]) -> Float[Array, "*b H"]:
        with jax.named_scope("lcx.HeadRMSNorm"):
            return _rms_norm(x, self.weight, self.eps, self.offset)


class Embedding(eqx.Module):
    """Token embedding table ``[V, D]``; also the output head when embeddings are tied."""

    weight: Float[Array, "V D"] = eqx.field(metadata=param("vocab", "embed", role="embedding"))

    def __init__(self, vocab_size: int, d_model: int, *, key: PRNGKeyArray, dtype=jnp.float32):
        self.weight = normal(key, (vocab_size, d_model), INIT_STD, dtype)

    def __call__(self, tokens: Int[Array, "*b T"]) -> Float[Array, "*b T D"]:
        with jax.named_scope("lcx.Embedding"):
            return jnp.take(self.weight, tokens, axis=0)


_ACTIVATIONS = {"silu": jax.nn.silu, "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True)}
"""``ModelConfig.mlp_activation`` -> its function (tanh GELU is torch's ``gelu(approximate="tanh")``)."""


class MLP(eqx.Module):
    """Gated feed-forward ``w_down(act(x w_gate) * (x w_up))`` (Shazeer 2020, arXiv:2002.05202):
    SwiGLU with ``act = silu``, GeGLU with tanh GELU (``ModelConfig.mlp_activation``)."""

    w_gate: Float[Array, "D F"] = eqx.field(metadata=param("embed", "mlp", role="weight"))
    w_up: Float[Array, "D F"] = eqx.field(metadata=param("embed", "mlp", role="weight"))
    w_down: Float[Array, "F D"] = eqx.field(metadata=param("mlp", "embed", role="weight"))
    activation: str = eqx.field(static=True, default="silu")

    def __init__(self, cfg: ModelConfig, *, key: PRNGKeyArray):
        D, F = cfg.d_model, cfg.mlp_dim
        dt = jnp.dtype(cfg.param_dtype)
        kg, ku, kd = jax.random.split(key, 3)
        self.w_gate = normal(kg, (D, F), INIT_STD, dt)
        self.w_up = normal(ku, (D, F), INIT_STD, dt)
        self.w_down = normal(kd, (F, D), INIT_STD / math.sqrt(2 * cfg.n_layers), dt)
        self.activation = cfg.mlp_activation

    def __call__(self, x: Hidden) -> Hidden:
        with jax.named_scope("lcx.MLP"):
            act = _ACTIVATIONS[self.activation]
            h = act(jnp.einsum("BTD,DF->BTF", x, self.w_gate)) * jnp.einsum("BTD,DF->BTF", x, self.w_up)
            return jnp.einsum("BTF,FD->BTD", h, self.w_down)


__all__ = ["INIT_STD", "Hidden", "MLP", "Embedding", "HeadRMSNorm", "RMSNorm", "normal"]
