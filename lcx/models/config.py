"""Model configuration: a frozen dataclass (the presets that name its values: lcx.models.presets).

The presets are read from ``conf/model/*.yaml``, so a model is named the same way, with the same
values, in code (``preset("llama3_70b")``) and in Hydra (``model=llama3_70b``).
Sizes follow the Llama 3 paper (Grattafiori et al. 2024, arXiv:2407.21783, Table 3).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from lcx.models.kinds import LayerKind, layer_kinds, parse_layer_pattern, pattern_to_yaml
from lcx.models.rotary import RopeConfig

REMAT_POLICIES: tuple[str, ...] = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable", "custom")
"""Rematerialisation of each scanned block (``jax.checkpoint`` policies): ``none`` saves every
activation; ``full`` saves only the block inputs; ``dots_saveable`` saves matmul outputs;
``dots_with_no_batch_dims_saveable`` saves only matmuls without batch dimensions (the projections,
not attention scores); ``custom`` (MaxText's ``remat_policy: custom``) saves only the named
tensors, each kept on device, offloaded to host memory or recomputed as ``model.remat_layer_input``,
``model.remat_qkv`` and ``model.remat_context`` say (:data:`REMAT_PLACEMENTS`)."""

REMAT_PLACEMENTS: dict[str, tuple[str, ...]] = {
    "remat_layer_input": ("device", "offload"),
    "remat_qkv": ("device", "offload", "remat"),
    "remat_context": ("device", "offload", "remat"),
}
"""Where ``remat: custom`` keeps each named tensor for the backward pass: ``device`` (saved in
device memory), ``offload`` (copied to pinned host memory in the forward and back in the backward)
or ``remat`` (recomputed). The block input cannot be recomputed: it is what the replay starts
from."""

DTYPES: tuple[str, ...] = ("float32", "bfloat16")

MLP_ACTIVATIONS: tuple[str, ...] = ("silu", "gelu_tanh")
"""The gate activations of the gated MLP: ``silu`` (SwiGLU; Llama, Mistral, Qwen) and ``gelu_tanh``
(GeGLU with GELU's tanh approximation, Hendrycks & Gimpel 2016; Gemma's ``gelu_pytorch_tanh``)."""

ROPE_FIELDS: dict[str, str] = {
    f.name: "rope_scaling_factor" if f.name == "factor" else f"rope_{f.name}"
    for f in dataclasses.fields(RopeConfig)
    if f.name != "head_dim"
}
"""The :class:`ModelConfig` field of each :class:`RopeConfig` field (``head_dim`` is the model's own)."""

_ROPE_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(RopeConfig)}


def _size(default: int, axis: str) -> Any:
    """A size field whose value is the length of the logical axis ``axis`` (:meth:`ModelConfig.dims`)."""
    return dataclasses.field(default=default, metadata={"axis": axis})


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A Llama-family decoder: pre-norm blocks of GQA attention and a SwiGLU MLP.

    Attributes:
      name: label for tables and run directories.
      vocab_size: V, tokens in the vocabulary (embedding rows). ``model.vocab_size: null`` in
        a config means the tokenizer's, padded to a multiple of 128 (resolved at the config edge,
        :func:`lcx.config.run.model_config`; :data:`lcx.data.tokenizers.VOCAB_MULTIPLE` says why).
      d_model: D, width of the residual stream.
      n_layers: L, number of blocks.
      n_heads: N, query heads.
      n_kv_heads: K, key/value heads; N must be a multiple of K (GQA, Ainslie et al. 2023,
        arXiv:2305.13245). K == N is multi-head attention, K == 1 multi-query attention.
      head_dim: H, width of one head.
      mlp_dim: F, hidden width of the SwiGLU MLP.
      rope_theta: RoPE base wavelength (RoFormer, arXiv:2104.09864); 500000 in Llama 3.
      rope_scaling_type: RoPE frequency scaling for long context (:mod:`lcx.models.rotary`):
        None (plain RoPE), ``"linear"`` (position interpolation), ``"ntk"`` (NTK-aware: the base
        raised to ``theta * s ** (H / (H - 2))``), ``"llama3"`` (Llama 3.1, Meta's llama-models
        ``apply_scaling``) or
        ``"yarn"`` (Peng et al. 2023, arXiv:2309.00071, as Hugging Face transformers computes
        it). Left None while ``rope_scaling_factor`` is set it becomes ``"llama3"``.
      rope_scaling_factor: context stretch factor s (8 in Llama 3.1): llama3 stretches
        wavelengths longer than ``rope_original_max_len / rope_low_freq_factor`` by s, keeps
        those shorter than ``rope_original_max_len / rope_high_freq_factor`` and interpolates
        between; yarn interpolates by s with a ramp over pairs. None: plain RoPE.
      rope_original_max_len: context length in tokens the unscaled model was trained at (8192).
      rope_low_freq_factor: llama3 band edge (Meta's default 1).
      rope_high_freq_factor: llama3 band edge (Meta's default 4).
      rope_beta_fast: yarn ramp edge, rotations per ``rope_original_max_len`` (paper: 32).
      rope_beta_slow: yarn ramp edge (paper: 1).
      rope_attention_factor: yarn multiplier of cos and sin, hence of both q and k (logits scale
        by its square, as in transformers); None: ``0.1 ln(s) + 1``. Ignored by other types.
      norm_eps: RMSNorm epsilon.
      tie_embeddings: if True the output head is the transposed token embedding.
      remat: one of :data:`REMAT_POLICIES`.
      remat_layer_input: ``remat: custom`` only: placement of each block's input ``[B, T, D]``
        (MaxText ``decoder_layer_input``): ``device`` or ``offload``.
      remat_qkv: ``remat: custom`` only: placement of q ``[B, T, N, H]`` and k, v ``[B, T, K, H]``
        after RoPE (the attention inputs): ``device``, ``offload`` or ``remat`` (the norm, the
        projections and RoPE are replayed).
      remat_context: ``remat: custom`` only: placement of the flash-attention residuals, the
        float32 output ``[B, T, N, H]`` and logsumexp ``[B, T, N]`` (MaxText ``context``, the
        splash kernel's ``residual_checkpoint_name``): ``device``/``offload`` keep them, so the
        backward never replays the attention forward (nor, for ring, its K/V hops); ``remat``
        replays it.
      dtype: compute dtype, ``float32`` or ``bfloat16``. Parameters are cast to it inside the
        forward pass; norms, softmax and logits are computed in float32.
      param_dtype: dtype the parameters (master weights) are stored in.
      sliding_window: attention window in tokens (``q_pos - k_pos < window``), or None.
      document_mask: if True (default) packed documents never attend to each other: a key is
        visible only if its segment id equals the query's.
      attention_sinks: if True every attention layer has a learnable sink logit per query head
        (``[N]`` per layer, initialised to 0; gpt-oss; StreamingLLM, Xiao et al. 2023,
        arXiv:2309.17453) that joins the softmax denominator as an extra key of value 0, so a
        head can attend "nowhere" (:mod:`lcx.attention.sinks`). Hydra:
        ``model.attention_sinks=true``. Default False: no sink parameters, the plain program. A
        non-boolean value raises ValueError. With ``layer_pattern`` it is the default of the
        kinds whose ``sinks`` is null.
      layer_pattern: None (default): a uniform model, every layer one kind (global, or sliding
        with ``sliding_window``). Otherwise one period of :class:`~lcx.models.kinds.LayerKind`
        (global / sliding / chunked, each with its own RoPE and sinks) that repeats over the
        depth, the remainder layers taking its first kinds (:attr:`layer_kinds`). YAML and
        Hydra: a list of mappings, each may carry ``repeat: n``
        (``[{kind: sliding, window: 512, repeat: 2}, {kind: global}]``, read by :meth:`from_dict`);
        in code a tuple of ``LayerKind``, one per layer of the period. The forward scans over periods (:class:`lcx.models.Llama`).
      attention_bias: q, k and v projections have biases (``[N, H]``, ``[K, H]``; Qwen2.5); the
        output projection has none.
      qk_norm: an RMSNorm with a learned ``[H]`` gain over each head's features of q and of k,
        before RoPE (Qwen3; Gemma 3).
      query_pre_attn_scalar: attention logits are scaled by ``query_pre_attn_scalar ** -0.5``
        instead of ``head_dim ** -0.5`` (Gemma 2/3's config field); None: the head size.
      norm_gain_offset: every RMSNorm multiplies by ``norm_gain_offset + w`` (Gemma's ``(1 + w)``
        with 1.0, gains initialised to 0; Llama's ``w`` with 0.0, gains initialised to 1).
      post_norms: an RMSNorm also on the outputs of attention and of the MLP, before each
        residual add (Gemma 2/3's "sandwich": pre- and post-norms around both).
      mlp_activation: the gate activation, one of :data:`MLP_ACTIVATIONS`.
      scale_embeddings: the embeddings are multiplied by ``sqrt(d_model)`` (rounded to the compute
        dtype, as Gemma does) before the first block. The family options (``attention_bias`` to
        here) default to Llama's; docs/model_families.md lists each family's values.

    Raises:
      ValueError: a size is not positive, N is not a multiple of K, an unknown remat policy,
        placement or dtype, a ``remat_*`` placement changed without ``remat: custom``, or
        ``sliding_window < 1``, a ``layer_pattern`` that :func:`~lcx.models.kinds.parse_layer_pattern`
        refuses, one together with ``sliding_window``, or a kind whose RoPE overrides do not make
        a valid table with the model's. The message names the field and the fix.
    """

    name: str = "custom"
    vocab_size: int = _size(256, "vocab")
    d_model: int = _size(128, "embed")
    n_layers: int = _size(4, "layers")
    n_heads: int = _size(8, "heads")
    n_kv_heads: int = _size(2, "kv_heads")
    head_dim: int = _size(16, "head_dim")
    mlp_dim: int = _size(384, "mlp")
    rope_theta: float = 10_000.0
    # the other RoPE defaults are RopeConfig's (one place for each value)
    rope_scaling_type: str | None = _ROPE_DEFAULTS["scaling_type"]
    rope_scaling_factor: float | None = _ROPE_DEFAULTS["factor"]
    rope_original_max_len: int = _ROPE_DEFAULTS["original_max_len"]
    rope_low_freq_factor: float = _ROPE_DEFAULTS["low_freq_factor"]
    rope_high_freq_factor: float = _ROPE_DEFAULTS["high_freq_factor"]
    rope_beta_fast: float = _ROPE_DEFAULTS["beta_fast"]
    rope_beta_slow: float = _ROPE_DEFAULTS["beta_slow"]
    rope_attention_factor: float | None = _ROPE_DEFAULTS["attention_factor"]
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    remat: str = "none"
    remat_layer_input: str = "device"
    remat_qkv: str = "remat"
    remat_context: str = "remat"
    dtype: str = "float32"
    param_dtype: str = "float32"
    sliding_window: int | None = None
    document_mask: bool = True
    attention_sinks: bool = False
    layer_pattern: tuple[LayerKind, ...] | None = None
    attention_bias: bool = False
    qk_norm: bool = False
    query_pre_attn_scalar: float | None = None
    norm_gain_offset: float = 0.0
    post_norms: bool = False
    mlp_activation: str = "silu"
    scale_embeddings: bool = False

    def __post_init__(self):
        # YAML may give 500000 for a float field; store floats so equal configs hash equal
        object.__setattr__(self, "rope_theta", float(self.rope_theta))
        object.__setattr__(self, "norm_eps", float(self.norm_eps))
        for f in ("rope_low_freq_factor", "rope_high_freq_factor", "rope_beta_fast", "rope_beta_slow"):
            object.__setattr__(self, f, float(getattr(self, f)))
        for f in ("rope_scaling_factor", "rope_attention_factor"):
            if getattr(self, f) is not None:
                object.__setattr__(self, f, float(getattr(self, f)))
        if self.rope_scaling_type is None and self.rope_scaling_factor is not None:
            object.__setattr__(self, "rope_scaling_type", "llama3")  # the one kind lcx had first
        ints = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim")
        for f in ints + ("rope_original_max_len",):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"model.{f} must be a positive integer, got {v!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"model.n_heads={self.n_heads} is not a multiple of model.n_kv_heads={self.n_kv_heads} "
                f"(GQA groups query heads over kv heads); set n_kv_heads to a divisor of {self.n_heads}"
            )
        if self.rope_theta <= 0 or self.norm_eps <= 0:
            raise ValueError(
                f"model.rope_theta ({self.rope_theta}) and model.norm_eps ({self.norm_eps}) must be positive"
            )
        if self.head_dim % 2:
            raise ValueError(f"model.head_dim={self.head_dim} must be even (RoPE rotates pairs of features)")
        if self.rope_scaling_factor is not None and self.rope_scaling_factor < 1:
            raise ValueError(
                f"model.rope_scaling_factor={self.rope_scaling_factor} must be >= 1 (it stretches "
                "wavelengths) or null for plain RoPE"
            )
        if self.rope_scaling_type is not None and self.rope_scaling_factor is None:
            raise ValueError(
                f"model.rope_scaling_type={self.rope_scaling_type!r} needs model.rope_scaling_factor "
                "(e.g. 8.0), or set rope_scaling_type to null for plain RoPE"
            )
        try:
            self.rope  # noqa: B018 - RopeConfig checks the type and the band edges
        except ValueError as e:
            raise ValueError(f"model.rope_*: {e}") from None
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"model.remat={self.remat!r} is unknown; choose one of {REMAT_POLICIES}")
        for f, choices in REMAT_PLACEMENTS.items():
            v = getattr(self, f)
            if v not in choices:
                raise ValueError(f"model.{f}={v!r} is unknown; choose one of {choices}")
            if self.remat != "custom" and v != ModelConfig.__dataclass_fields__[f].default:
                raise ValueError(
                    f"model.{f}={v!r} needs model.remat=custom (remat={self.remat!r} decides what is saved "
                    f"by itself); set remat: custom, or {f}: {ModelConfig.__dataclass_fields__[f].default}"
                )
        for f in ("dtype", "param_dtype"):
            if getattr(self, f) not in DTYPES:
                raise ValueError(f"model.{f}={getattr(self, f)!r} is unknown; choose one of {DTYPES}")
        if self.sliding_window is not None and (not isinstance(self.sliding_window, int) or self.sliding_window < 1):
            raise ValueError(
                f"model.sliding_window must be a positive number of tokens or null, got {self.sliding_window!r}"
            )
        for f in ("attention_sinks", "attention_bias", "qk_norm", "post_norms", "scale_embeddings"):
            if not isinstance(getattr(self, f), bool):
                raise ValueError(f"model.{f} must be true or false, got {getattr(self, f)!r}")
        self._check_family_options()
        self._check_layer_pattern()

    def _check_family_options(self) -> None:
        if self.mlp_activation not in MLP_ACTIVATIONS:
            raise ValueError(
                f"model.mlp_activation={self.mlp_activation!r} is unknown; choose one of {MLP_ACTIVATIONS}"
            )
        q = self.query_pre_attn_scalar
        if q is not None and (isinstance(q, bool) or not isinstance(q, (int, float)) or q <= 0):
            raise ValueError(f"model.query_pre_attn_scalar must be a positive number or null (head_dim), got {q!r}")
        if q is not None:
            object.__setattr__(self, "query_pre_attn_scalar", float(q))
        g = self.norm_gain_offset
        if isinstance(g, bool) or not isinstance(g, (int, float)):
            raise ValueError(f"model.norm_gain_offset must be a number (0.0: w, 1.0: Gemma's 1 + w), got {g!r}")
        object.__setattr__(self, "norm_gain_offset", float(g))

    def _check_layer_pattern(self) -> None:
        object.__setattr__(self, "layer_pattern", parse_layer_pattern(self.layer_pattern))
        if self.layer_pattern is None:
            return
        if self.sliding_window is not None:
            raise ValueError(
                f"model.layer_pattern and model.sliding_window={self.sliding_window} are both set (which "
                "layers get the window?); put the window in the pattern ({kind: sliding, window: "
                f"{self.sliding_window}}}) and set sliding_window: null"
            )
        for i, kind in enumerate(self.layer_pattern):
            try:
                kind.rope_config(self.rope)
            except ValueError as e:
                raise ValueError(f"model.layer_pattern[{i}] ({kind.kind}): RoPE overrides: {e}") from None

    # ------------------------------------------------------------------ derived
    @property
    def rope(self) -> RopeConfig:
        """The RoPE frequency table and attention factor this model uses."""
        return RopeConfig(head_dim=self.head_dim, **{k: getattr(self, f) for k, f in ROPE_FIELDS.items()})

    @property
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """One :class:`~lcx.models.kinds.LayerKind` per layer (length ``n_layers``), ``sinks``
        resolved to a bool (null: ``attention_sinks``). Uniform: ``n_layers`` copies of the kind
        ``sliding_window`` and ``attention_sinks`` describe; a pattern repeats, its first kinds
        filling the remainder (Gemma 3's rule, :func:`lcx.models.kinds.layer_kinds`)."""
        return layer_kinds(self.period_kinds, self.n_layers)

    @property
    def period_kinds(self) -> tuple[LayerKind, ...]:
        """The P kinds of one pattern period (``sinks`` resolved); ``(kind,)`` for a uniform model."""
        if self.layer_pattern is None:
            kind = "global" if self.sliding_window is None else "sliding"
            return (LayerKind(kind, window=self.sliding_window, sinks=self.attention_sinks),)
        return tuple(
            k if k.sinks is not None else dataclasses.replace(k, sinks=self.attention_sinks) for k in self.layer_pattern
        )

    @property
    def has_sinks(self) -> bool:
        """Whether the layers hold sink logits (``[L, N]``): some kind has sinks on."""
        return any(k.sinks for k in self.period_kinds)

    @property
    def group_size(self) -> int:
        """G = N / K, query heads sharing one kv head."""
        return self.n_heads // self.n_kv_heads

    @property
    def attention_params_per_layer(self) -> int:
        """Weights of wq, wk, wv, wo in one block: ``2 D N H + 2 D K H``."""
        D, H = self.d_model, self.head_dim
        return 2 * D * self.n_heads * H + 2 * D * self.n_kv_heads * H

    @property
    def mlp_params_per_layer(self) -> int:
        """Weights of w_gate, w_up, w_down in one block: ``3 D F``."""
        return 3 * self.d_model * self.mlp_dim

    @property
    def params_per_layer(self) -> int:
        """Projection weights of one block (attention + MLP), the count FLOP estimates use.

        Excludes the block's two RMSNorm gains (``2 D``), which :attr:`n_params` includes.
        855,638,016 for Llama 3 70B.
        """
        return self.attention_params_per_layer + self.mlp_params_per_layer

    @property
    def n_params(self) -> int:
        """Every parameter: embedding, blocks (with norm gains, and per the family options q/k/v
        biases, q/k norm gains, post-norm gains; when some kind has sinks (:attr:`has_sinks`) N
        sink logits each), final norm, untied head."""
        D, V = self.d_model, self.vocab_size
        head = 0 if self.tie_embeddings else V * D
        per_layer = self.params_per_layer + (4 if self.post_norms else 2) * D
        per_layer += self.n_heads if self.has_sinks else 0
        per_layer += (self.n_heads + 2 * self.n_kv_heads) * self.head_dim if self.attention_bias else 0
        per_layer += 2 * self.head_dim if self.qk_norm else 0
        return V * D + self.n_layers * per_layer + D + head

    def dims(self) -> dict[str, int]:
        """Sizes of the logical axes the parameters use, for :meth:`lcx.sharding.Plan.validate`."""
        return {f.metadata["axis"]: getattr(self, f.name) for f in dataclasses.fields(self) if "axis" in f.metadata}

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        """Config from a mapping (e.g. the Hydra ``model`` node converted to a dict).

        ``layer_pattern`` may be in its YAML form (:func:`~lcx.models.kinds.parse_layer_pattern`).

        Raises:
          ValueError: a key is not a field of :class:`ModelConfig`, or a field check fails.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown model config keys {unknown}; known keys are {sorted(names)}")
        d = dict(d)
        if "layer_pattern" in d:  # the YAML form: a list of mappings, each may carry repeat
            d["layer_pattern"] = parse_layer_pattern(d["layer_pattern"])
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """Every field, as YAML writes it (``layer_pattern`` as a list of mappings with
        ``repeat``); :meth:`from_dict` reads it back."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["layer_pattern"] = pattern_to_yaml(self.layer_pattern)
        return d

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)


def check_rope_overrides(rope: Any, *, where: str) -> None:
    """Refuse RoPE overrides of a stored model config that name anything but a RoPE field.

    Args:
      rope: ``{field: value}`` to set (None: nothing); where: the config key, for messages.

    Raises:
      ValueError: not a mapping, or a key that is not a ``rope_*`` field of :class:`ModelConfig`
        (names it and the valid ones).
    """
    valid = sorted(f.name for f in dataclasses.fields(ModelConfig) if f.name.startswith("rope_"))
    if rope is not None and not isinstance(rope, Mapping):
        raise ValueError(
            f"{where}={rope!r}: must be null or a mapping of RoPE fields, e.g. {{rope_scaling_type: yarn}}"
        )
    for k in rope or {}:
        if k not in valid:
            raise ValueError(
                f"{where}.{k}: only the model's RoPE fields can be changed on a trained model (no parameter "
                f"depends on them); use some of {', '.join(valid)}"
            )
