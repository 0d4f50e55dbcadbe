"""Llama-family decoder as Equinox modules.

``embed -> [block: RMSNorm -> GQA attention(plan) -> RMSNorm -> SwiGLU MLP] x L -> RMSNorm ->
logits``, pre-norm with residual connections (Llama 3, arXiv:2407.21783). The L blocks are one
module whose array leaves carry a leading ``layers`` axis (built with ``eqx.filter_vmap``) and are
applied with ``jax.lax.scan``, so compile time does not grow with depth.

Layer kinds (:mod:`lcx.models.kinds`): each layer is global, sliding or chunked, with its own RoPE
table (or none) and sinks on or off. The parameters stay one stack ``[L, ...]`` whatever the
kinds (checkpoints, the HF import, sharding rules and weight-decay roles do not see them); the
forward views it as ``[L // P, P, ...]`` for a pattern of P kinds and scans over the periods,
the scan body applying the P layers of one period in order, each with its kind's mask, RoPE and
sinks; the ``L mod P`` remainder layers (the pattern's first kinds) run after the scan. A
uniform model is the one-kind case, P = 1: exactly the program it was before kinds existed.

Einsum letters (Gemma's convention): B batch, T query length, S key length, D model width,
N query heads, K kv heads, G = N / K group size, H head width, F MLP width, V vocabulary.

Every parameter field is declared with :func:`lcx.models.params.param` metadata: its logical axes (a module
field's axes are prepended to those of everything inside it; the stacked blocks add ``"layers"``),
which :mod:`lcx.models.sharding` turns into ``NamedSharding`` through a plan, and its role
(weight, embedding, norm, sink), which decides its weight decay.

Every module call runs under ``jax.named_scope`` (``lcx.Embedding``, ``lcx.Block``, ``lcx.RMSNorm``,
``lcx.Attention`` with ``qkv_proj`` / ``o_proj`` inside, ``lcx.MLP``, ``lcx.Llama.logits``), as
``equinox.nn.Linear`` does, so a profile or HLO dump reads as the architecture does; scopes name
operations only and change no numerics. They are ``with`` blocks, not decorators: a decorator's
wrapper would hide the jaxtyping annotations from the shape checks (``jaxtyped(typechecker=beartype)``).

Positions are global, per token, and arbitrary (they restart at document boundaries and arrive
permuted by the zigzag layout), so RoPE reads them from the ``positions`` argument, never from
an ``arange``.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, TypeAlias

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jaxtyping import Array, Float, Int, PRNGKeyArray, PyTree

from lcx.attention import Mask, attention
from lcx.models.config import ModelConfig
from lcx.models.kinds import LayerKind
from lcx.models.layers import INIT_STD, MLP, Embedding, HeadRMSNorm, Hidden, RMSNorm, normal
from lcx.models.params import param
from lcx.models.remat import REMAT_NAMES, remat_policy
from lcx.models.rotary import RopeConfig, apply_rope, rope, rope_cos_sin, rope_frequencies

__all__ = [
    "MLP",
    "Attention",
    "Block",
    "Embedding",
    "HeadRMSNorm",
    "LayerOptions",
    "Llama",
    "RMSNorm",
    "init_model",
    "remat_policy",
    "REMAT_NAMES",
    "rope",
    "rope_frequencies",
]
from lcx.sharding import MeshPlan

PerToken: TypeAlias = Int[Array, "B T"]
"""int32 ``[B, T]``, one value per token: token ids, global positions or segment ids."""


def _plus(x: Array, bias: Array | None) -> Array:
    """``x + bias`` (broadcast over the leading axes), or ``x`` for a module without the bias."""
    return x if bias is None else x + bias


def _cast(tree: PyTree, dtype) -> PyTree:
    """Floating-point arrays of ``tree`` cast to ``dtype`` (master weights -> compute dtype)."""
    return jax.tree.map(lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, tree)


class LayerOptions(NamedTuple):
    """How one decoder layer runs, from its :class:`~lcx.models.kinds.LayerKind`
    (:meth:`Llama.layer_options`)."""

    mask: Mask
    """Its attention mask (causal; document, window or chunk per the kind and the model)."""
    rope: RopeConfig | None
    """Its RoPE table; None: no rotary embedding (NoPE)."""
    sinks: bool
    """Whether it uses the sink logits (False: a model's sinks, if any, are ignored)."""


class Attention(eqx.Module):
    """Grouped-query self-attention with RoPE (GQA: Ainslie et al. 2023, arXiv:2305.13245).

    The N query heads form K groups of G; K/V are computed once per kv head and never repeated
    (the attention kernels reshape q into ``[K, G]``). The score computation, masks and context
    parallelism are delegated to :func:`lcx.attention.attention` with the given plan. When some
    layer kind has sinks (``cfg.has_sinks``) each query head has a learnable sink logit
    (``sinks``, ``[N]``, initialised to 0; :mod:`lcx.attention.sinks`), else ``sinks`` is None.
    The mask, the RoPE table and whether the sinks are used are the layer kind's, given per call.
    """

    wq: Float[Array, "D N H"] = eqx.field(metadata=param("embed", "heads", "head_dim", role="weight"))
    wk: Float[Array, "D K H"] = eqx.field(metadata=param("embed", "kv_heads", "head_dim", role="weight"))
    wv: Float[Array, "D K H"] = eqx.field(metadata=param("embed", "kv_heads", "head_dim", role="weight"))
    wo: Float[Array, "N H D"] = eqx.field(metadata=param("heads", "head_dim", "embed", role="weight"))
    sinks: Float[Array, " N"] | None = eqx.field(metadata=param("heads", role="sink"))
    bq: Float[Array, "N H"] | None = eqx.field(metadata=param("heads", "head_dim", role="bias"))
    bk: Float[Array, "K H"] | None = eqx.field(metadata=param("kv_heads", "head_dim", role="bias"))
    bv: Float[Array, "K H"] | None = eqx.field(metadata=param("kv_heads", "head_dim", role="bias"))
    q_norm: HeadRMSNorm | None
    k_norm: HeadRMSNorm | None
    q_scale: float = eqx.field(static=True)

    def __init__(self, cfg: ModelConfig, *, key: PRNGKeyArray):
        D, N, K, H = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        dt = jnp.dtype(cfg.param_dtype)
        kq, kk, kv, ko = jax.random.split(key, 4)
        self.wq = normal(kq, (D, N, H), INIT_STD, dt)
        self.wk = normal(kk, (D, K, H), INIT_STD, dt)
        self.wv = normal(kv, (D, K, H), INIT_STD, dt)
        # residual-branch outputs scaled by 1/sqrt(2L) so the residual variance stays O(1) in depth
        self.wo = normal(ko, (N, H, D), INIT_STD / math.sqrt(2 * cfg.n_layers), dt)
        # zero sink logits: the sink starts as one extra key of logit 0 (value 0) per head
        self.sinks = jnp.zeros((N,), dt) if cfg.has_sinks else None
        bias = cfg.attention_bias
        self.bq, self.bk, self.bv = (jnp.zeros(shape, dt) if bias else None for shape in ((N, H), (K, H), (K, H)))
        norm = functools.partial(HeadRMSNorm, H, eps=cfg.norm_eps, offset=cfg.norm_gain_offset, dtype=dt)
        self.q_norm, self.k_norm = (norm(), norm()) if cfg.qk_norm else (None, None)
        # the kernels scale logits by H ** -0.5; another scale is folded into q (1.0: none)
        qpas = cfg.query_pre_attn_scalar
        self.q_scale = 1.0 if qpas is None or qpas == H else math.sqrt(H / qpas)

    def __call__(
        self, x: Hidden, positions: PerToken, segment_ids: PerToken, *, layer: LayerOptions, plan: MeshPlan
    ) -> Hidden:
        """Attention of one layer of a kind: its mask, RoPE table or none, sinks or none
        (:class:`LayerOptions`).

        Raises:
          ValueError: ``layer.sinks`` on a module without sink logits.
        """
        mask, rope, sinks = layer
        if sinks and self.sinks is None:
            raise ValueError("this layer kind has sinks but the model holds none: build it with the kind's config")
        with jax.named_scope("lcx.Attention"):
            q, k, v = self.project(x, positions, rope)
            s = self.sinks if sinks else None
            o = attention(q, k, v, plan=plan, mask=mask, positions=positions, segment_ids=segment_ids, sinks=s)
            assert not isinstance(o, tuple)  # return_lse=False: the output alone
            return self.output(o)

    def project(
        self, x: Hidden, positions: PerToken, rope: RopeConfig | None
    ) -> tuple[Float[Array, "B T N H"], Float[Array, "B T K H"], Float[Array, "B T K H"]]:
        """``q, k, v`` of ``x`` at ``positions``: projections (with biases), QK-norm, RoPE (``rope``;
        None: none) and ``query_pre_attn_scalar``'s scale folded into q, exactly as :meth:`__call__`
        feeds the attention kernels (generation's prefill and decode call this too)."""
        # named for remat: custom (model.remat_qkv); the identity otherwise
        with jax.named_scope("qkv_proj"):
            q = _plus(jnp.einsum("BTD,DNH->BTNH", x, self.wq), self.bq)
            k = _plus(jnp.einsum("BSD,DKH->BSKH", x, self.wk), self.bk)
            v = _plus(jnp.einsum("BSD,DKH->BSKH", x, self.wv), self.bv)
            if self.q_norm is not None and self.k_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)  # per head, before RoPE (Qwen3, Gemma 3)
            if rope is not None:
                # exact phases from a float64 host table, shared by q and k (lcx.models.rotary)
                cos, sin = rope_cos_sin(positions, rope)
                q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            if self.q_scale != 1.0:
                q = q * jnp.asarray(self.q_scale, q.dtype)
            q, k = checkpoint_name(q, "query"), checkpoint_name(k, "key")
            return q, k, checkpoint_name(v, "value")

    def output(self, o: Float[Array, "B T N H"]) -> Hidden:
        """The output projection of the attention's result ``o``."""
        with jax.named_scope("o_proj"):
            return jnp.einsum("BTNH,NHD->BTD", o, self.wo)


class Block(eqx.Module):
    """One pre-norm decoder block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``; with
    ``post_norms`` (Gemma 2/3) ``x + post(attn(norm(x)))``, then ``x + post(mlp(norm(x)))``."""

    attn_norm: RMSNorm
    attn: Attention
    mlp_norm: RMSNorm
    mlp: MLP
    attn_post_norm: RMSNorm | None
    mlp_post_norm: RMSNorm | None

    def __init__(self, cfg: ModelConfig, *, key: PRNGKeyArray):
        ka, km = jax.random.split(key)
        norm = functools.partial(
            RMSNorm, cfg.d_model, eps=cfg.norm_eps, offset=cfg.norm_gain_offset, dtype=jnp.dtype(cfg.param_dtype)
        )
        self.attn_norm = norm()
        self.attn = Attention(cfg, key=ka)
        self.mlp_norm = norm()
        self.mlp = MLP(cfg, key=km)
        self.attn_post_norm, self.mlp_post_norm = (norm(), norm()) if cfg.post_norms else (None, None)

    def __call__(
        self, x: Hidden, positions: PerToken, segment_ids: PerToken, *, layer: LayerOptions, plan: MeshPlan
    ) -> Hidden:
        """One layer of a kind (``layer``: :meth:`Llama.layer_options` of the model's kind)."""
        with jax.named_scope("lcx.Block"):
            return self.finish(x, self.attn(self.attn_norm(x), positions, segment_ids, layer=layer, plan=plan))

    def finish(self, x: Hidden, a: Hidden) -> Hidden:
        """The block after its attention: ``x`` plus the attention output ``a`` (post-normed with
        ``post_norms``), then the MLP's residual branch (generation's layers call this too)."""
        x = x + (a if self.attn_post_norm is None else self.attn_post_norm(a))
        m = self.mlp(self.mlp_norm(x))
        return x + (m if self.mlp_post_norm is None else self.mlp_post_norm(m))


class Llama(eqx.Module):
    """Llama-family decoder-only language model (Llama 3, arXiv:2407.21783).

    Build with :func:`init_model`. Parameters are stored in ``config.param_dtype``; the forward
    pass casts them to ``config.dtype`` (one block at a time, inside the scan) and computes norms,
    softmax and logits in float32. The blocks are one stack ``[L, ...]``; the forward scans over
    the periods of ``config.layer_pattern`` (module docstring).
    """

    embed: Embedding
    blocks: Block = eqx.field(metadata={"axes": ("layers",)})  # every leaf stacked over L
    final_norm: RMSNorm
    head: Float[Array, "D V"] | None = eqx.field(metadata=param("embed", "vocab", role="weight"))
    config: ModelConfig = eqx.field(static=True)

    def __init__(self, cfg: ModelConfig, *, key: PRNGKeyArray):
        ke, kb, kh = jax.random.split(key, 3)
        dt = jnp.dtype(cfg.param_dtype)
        self.embed = Embedding(cfg.vocab_size, cfg.d_model, key=ke, dtype=dt)
        self.blocks = eqx.filter_vmap(lambda k: Block(cfg, key=k))(jax.random.split(kb, cfg.n_layers))
        self.final_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps, offset=cfg.norm_gain_offset, dtype=dt)
        self.head = None if cfg.tie_embeddings else normal(kh, (cfg.d_model, cfg.vocab_size), INIT_STD, dt)
        self.config = cfg

    @property
    def mask(self) -> Mask:
        """The attention mask every layer of a uniform model uses: causal, plus document and window
        per the config.

        Raises:
          ValueError: the model has a ``layer_pattern`` (see :meth:`layer_options` per kind).
        """
        if self.config.layer_pattern is not None:
            raise ValueError("a model with a layer_pattern has one mask per kind: use layer_options(kind).mask")
        return self.config.period_kinds[0].mask(self.config.document_mask)

    def layer_options(self, kind: LayerKind) -> LayerOptions:
        """How a :class:`Block` runs a layer of ``kind`` (one of ``config.layer_kinds``) in this model."""
        cfg = self.config
        return LayerOptions(kind.mask(cfg.document_mask), kind.rope_config(cfg.rope), bool(kind.sinks))

    def __call__(
        self, tokens: PerToken, positions: PerToken, segment_ids: PerToken, *, plan: MeshPlan
    ) -> Float[Array, "B T V"]:
        """Next-token logits: :meth:`logits` of :meth:`features`.

        Args:
          tokens: int32 ``[B, T]`` token ids in ``[0, V)``.
          positions: int32 ``[B, T]`` global positions (restart per document; any layout).
          segment_ids: int32 ``[B, T]`` document ids; with ``config.document_mask`` a token
            attends only within its own segment.
          plan: the sharding plan bound to a mesh; activations are constrained to its rules and
            attention runs with its context-parallel strategy.

        Returns:
          float32 logits ``[B, T, V]``.
        """
        with jax.named_scope("lcx.Llama"):
            return self.logits(self.features(tokens, positions, segment_ids, plan=plan), plan=plan)

    def features(self, tokens: PerToken, positions: PerToken, segment_ids: PerToken, *, plan: MeshPlan) -> Hidden:
        """The final norm's output, the input of the output head (arguments as :meth:`__call__`).

        Returns:
          ``[B, T, D]`` in ``config.dtype``. The loss computes the logits from it whole or in
          vocabulary tiles (:func:`lcx.training.loss.vocab_tiled_loss_sum_and_count`).
        """
        with jax.named_scope("lcx.Llama.features"):
            cfg = self.config
            dtype = jnp.dtype(cfg.dtype)
            x = self.embed_tokens(tokens)
            x = plan.constrain(x, ("batch", "seq", "embed"))

            dynamic, static = eqx.partition(self.blocks, eqx.is_array)

            def layer(options: LayerOptions, x: Array, params: PyTree) -> Array:
                # every later use reads the named value, so an offloaded input is the only copy kept
                x = checkpoint_name(x, "decoder_layer_input")
                block = _cast(eqx.combine(params, static), dtype)
                x = block(x, positions, segment_ids, layer=options, plan=plan)
                return plan.constrain(x, ("batch", "seq", "embed"))

            # one function per kind of the period; remat (and its named residuals) per layer
            layers = [functools.partial(layer, self.layer_options(k)) for k in cfg.period_kinds]
            if cfg.remat != "none":
                # prevent_cse=False: inside scan CSE cannot undo the rematerialisation, and the
                # barrier it would add only slows things down (jax.checkpoint docs)
                placements = {f: getattr(cfg, f) for f in REMAT_NAMES} if cfg.remat == "custom" else {}
                policy = remat_policy(cfg.remat, **placements)
                layers = [jax.checkpoint(f, policy=policy, prevent_cse=False) for f in layers]
            P = len(layers)
            n, rest = divmod(cfg.n_layers, P)

            def period(x: Array, params: PyTree) -> tuple[Array, None]:
                # leaves [P, ...]: the P layers of one period, in order (P = 1: one layer's leaves)
                for j, f in enumerate(layers):
                    x = f(x, params if P == 1 else jax.tree.map(lambda a, j=j: a[j], params))
                return x, None

            if n:
                periods = dynamic if P == 1 else jax.tree.map(lambda a: a[: n * P].reshape(n, P, *a.shape[1:]), dynamic)
                x, _ = jax.lax.scan(period, x, periods)
            for j in range(rest):  # the remainder layers take the pattern's first kinds
                x = layers[j](x, jax.tree.map(lambda a, i=n * P + j: a[i], dynamic))

            return self.final_norm(x)

    def embed_tokens(self, tokens: Int[Array, "*b T"]) -> Float[Array, "*b T D"]:
        """The residual stream's input: the token embeddings in ``config.dtype``, times
        ``sqrt(d_model)`` with ``scale_embeddings`` (Gemma: the factor rounded to that dtype first)."""
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype)
        x = self.embed(tokens).astype(dtype)
        if cfg.scale_embeddings:
            x = x * jnp.asarray(math.sqrt(cfg.d_model), dtype)
        return x

    def output_head(self) -> Float[Array, "D V"]:
        """The output projection ``[D, V]`` in ``config.dtype`` (the embedding's transpose when tied)."""
        head = self.embed.weight.T if self.head is None else self.head
        return head.astype(jnp.dtype(self.config.dtype))

    def logits(self, x: Hidden, *, plan: MeshPlan) -> Float[Array, "B T V"]:
        """float32 logits ``[B, T, V]`` of the final norm's output ``x`` (:meth:`features`)."""
        with jax.named_scope("lcx.Llama.logits"):
            # logits in float32: the softmax over a 128K vocabulary is sensitive to rounding
            logits = jnp.einsum("BTD,DV->BTV", x, self.output_head(), preferred_element_type=jnp.float32)
            return plan.constrain(logits, ("batch", "seq", "vocab"))


def init_model(cfg: ModelConfig, *, key: PRNGKeyArray) -> Llama:
    """A freshly initialised :class:`Llama` with parameters in ``cfg.param_dtype``.

    Weights are normal(0, 0.02); the output projections of each residual branch (``wo``,
    ``w_down``) are scaled by ``1 / sqrt(2 L)`` (GPT-2, Radford et al. 2019) so the residual
    stream's variance does not grow with depth; RMSNorm gains are one; attention sinks (with
    ``cfg.has_sinks``) are zero. To create a model that is
    too large for one device directly sharded, use :func:`lcx.models.init_sharded`.
    """
    return Llama(cfg, key=key)
