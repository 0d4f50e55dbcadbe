"""Per-token bytes of one Llama block's activations: what each remat policy saves, what the
backward's phases hold, and the loss phase.

Pure arithmetic on a model config: the parameter shapes mirror ``lcx.models.llama`` field for
field (a test checks them against the abstract model), and the activation accounting follows its
block (pre-norm GQA attention + SwiGLU MLP, scanned over layers) under the policy of
:mod:`lcx.cost.policy`. The attention call's own buffers (strategy and kernel) are
:mod:`lcx.cost.attention_memory`'s; the per-device totals :mod:`lcx.cost.breakdown`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

from lcx.cost.dtypes import dtype_bytes
from lcx.cost.flops import ModelDims
from lcx.cost.policy import ActivationPolicy
from lcx.sharding import axes as ax
from lcx.sharding.describe import ArrayInfo


def param_arrays(cfg: ModelDims, param_dtype: str = "float32", *, tie_embeddings: bool = False) -> list[ArrayInfo]:
    """Every parameter kind of the Llama model with its logical axes and global shape.

    Mirrors ``lcx.models.llama`` (Embedding, stacked Blocks with a leading ``layers`` axis and,
    if some layer kind has sinks (``cfg.has_sinks``), their ``[layers, heads]`` sink logits,
    final RMSNorm, untied head), so :func:`lcx.sharding.describe.describe` can lay them out
    without building a model.
    """
    D, N, K, H, F, V, L = (
        cfg.d_model,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.head_dim,
        cfg.mlp_dim,
        cfg.vocab_size,
        cfg.n_layers,
    )
    b = dtype_bytes(param_dtype)
    E, Hd, Hs, Kv, M, Vo, Ly = ax.EMBED, ax.HEAD_DIM, ax.HEADS, ax.KV_HEADS, ax.MLP, ax.VOCAB, ax.LAYERS
    out = [
        ArrayInfo("embed", "param", (Vo, E), (V, D), b),
        ArrayInfo("attn_norm", "param", (Ly, E), (L, D), b),
        ArrayInfo("wq", "param", (Ly, E, Hs, Hd), (L, D, N, H), b),
        ArrayInfo("wk", "param", (Ly, E, Kv, Hd), (L, D, K, H), b),
        ArrayInfo("wv", "param", (Ly, E, Kv, Hd), (L, D, K, H), b),
        ArrayInfo("wo", "param", (Ly, Hs, Hd, E), (L, N, H, D), b),
        ArrayInfo("mlp_norm", "param", (Ly, E), (L, D), b),
        ArrayInfo("w_gate", "param", (Ly, E, M), (L, D, F), b),
        ArrayInfo("w_up", "param", (Ly, E, M), (L, D, F), b),
        ArrayInfo("w_down", "param", (Ly, M, E), (L, F, D), b),
        ArrayInfo("final_norm", "param", (E,), (D,), b),
    ]
    if not tie_embeddings:
        out.append(ArrayInfo("head", "param", (E, Vo), (D, V), b))
    # one sink logit per query head and layer, when some layer kind has sinks
    if getattr(cfg, "has_sinks", getattr(cfg, "attention_sinks", False)):
        out.append(ArrayInfo("sinks", "param", (Ly, Hs), (L, N), b))
    return out


def activation_arrays(cfg: ModelDims, seq_len: int, global_batch: int, dtype: str = "bfloat16") -> list[ArrayInfo]:
    """Activation kinds of one layer (global shapes): tokens ``[batch, seq]`` int32, residual
    ``[batch, seq, embed]``, q ``[batch, seq, heads, head_dim]``, k/v ``[batch, seq, kv_heads,
    head_dim]``, MLP hidden ``[batch, seq, mlp]``, logits ``[batch, seq, vocab]`` float32."""
    B, S = global_batch, seq_len
    a = dtype_bytes(dtype)
    Bt, Sq = ax.BATCH, ax.SEQ
    return [
        ArrayInfo("tokens", "activation", (Bt, Sq), (B, S), 4),
        ArrayInfo("residual", "activation", (Bt, Sq, ax.EMBED), (B, S, cfg.d_model), a),
        ArrayInfo("q", "activation", (Bt, Sq, ax.HEADS, ax.HEAD_DIM), (B, S, cfg.n_heads, cfg.head_dim), a),
        ArrayInfo("k/v", "activation", (Bt, Sq, ax.KV_HEADS, ax.HEAD_DIM), (B, S, cfg.n_kv_heads, cfg.head_dim), a),
        ArrayInfo("mlp hidden", "activation", (Bt, Sq, ax.MLP), (B, S, cfg.mlp_dim), a),
        ArrayInfo("logits", "activation", (Bt, Sq, ax.VOCAB), (B, S, cfg.vocab_size), 4),
    ]


def kv_cache_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, bytes_per_element: int = 2) -> int:
    """KV-cache bytes per token: ``2 (K and V) * L * n_kv * d_head * bytes``.

    Llama 3 70B in 16-bit (80 layers, 8 kv heads of 128): 327,680 bytes (0.3125 MiB); tests/test_cost.py.
    """
    return 2 * n_layers * n_kv_heads * head_dim * bytes_per_element


def kv_cache_bytes_per_device(
    groups: Sequence[tuple[int, int]], *, local_batch: int, kv_heads: int, head_dim: int, bytes_per_element: int = 2
) -> int:
    """Bytes of a context-parallel KV cache on one device (:mod:`lcx.generate.cache`): K and V
    of every layer of every cache group, plus the int32 position and segment id of each slot.

    Args:
      groups: ``(layers, local_slots)`` per cache group: the layers sharing the group's slots and
        the slots one device holds (global layers: ``T / P`` prompt slots plus
        ``ceil(max_new / P)`` appended; sliding/chunked: ``ceil(min(span, T + max_new) / P)``).
      local_batch: b, rows per device.
      kv_heads: k, kv heads per device.
      head_dim: h.
      bytes_per_element: a, of K and V (2 for bfloat16).

    Returns:
      ``sum_g (2 L_g b s_g k h a + 8 b s_g)`` bytes.
    """
    return sum(
        2 * L * local_batch * s * kv_heads * head_dim * bytes_per_element + 8 * local_batch * s for L, s in groups
    )


def saved_bytes_per_token_per_layer(
    cfg: ModelDims, policy: ActivationPolicy, dtype: str = "bfloat16"
) -> tuple[int, int]:
    """Bytes one token leaves saved for the backward pass in one block: (on device, on host).

    Counted from the block of ``lcx.models.llama`` with activations in ``dtype`` (a bytes):

    - ``none``: what JAX's linearization of the block keeps (listed with
      ``jax.ad_checkpoint.print_saved_residuals``, float32 and bfloat16): per RMSNorm its input
      and normalised input in float32 (``2 x 4D``), its two per-token statistics (``2 x 4``) and
      its output in ``a`` (``D a``); q, k, v after RoPE (``(N + 2K) H a``; RoPE is linear, so
      the pre-RoPE values are not needed); the four int32 position / segment-id rows the
      attention call was given (``16``); the flash residuals, float32 output and logsumexp
      (``4 (N H + N)``), plus the output cast to ``a`` when ``a`` is not float32 (``N H a``,
      the input of ``wo``); and six ``[F]`` SwiGLU tensors (gate, up, sigmoid(gate),
      silu(gate), the derivative's factor and h: ``6 F a``);
    - ``dots_saveable`` / ``dots_with_no_batch_dims_saveable``: the block input and the outputs
      of the projection matmuls (``(N+2K)H + 2D + 2F``); ``dots_saveable`` also keeps the flash
      residuals, float32 output and logsumexp (``4 (N H + N)``: ``lcx.models.remat_policy``
      adds them, else the backward would rebuild them from the attention kernel's saved logits
      tiles); the attention kernel's own matmuls have batch dimensions, so
      ``dots_with_no_batch_dims_saveable`` keeps nothing of attention and replays it;
    - ``full``: the block input only (``D``);
    - ``custom``: the block input, unless ``context=remat`` the flash residuals (float32 output
      and logsumexp, ``4 (N H + N)``), unless ``qkv=remat`` q, k, v after RoPE (``a (N + 2K) H``);
      each on device or host as placed (``jax.checkpoint_policies.
      save_and_offload_only_these_names`` in ``lcx.models.remat_policy``).
    """
    D, N, K, H, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.mlp_dim
    a = dtype_bytes(dtype)
    r = policy.remat
    layer_in = D * a
    if r == "none":
        norms = 2 * (2 * 4 * D + 2 * 4 + D * a)  # attention norm and MLP norm
        attn = (N + 2 * K) * H * a + 4 * 4 + 4 * (N * H + N) + (N * H * a if a != 4 else 0)
        return norms + attn + 6 * F * a, 0
    if r in ("dots_saveable", "dots_with_no_batch_dims_saveable"):
        other = a * ((N + 2 * K) * H + 2 * D + 2 * F) + (4 * (N * H + N) if r == "dots_saveable" else 0)
        return (layer_in if policy.decoder_layer_input == "device" else 0) + other, (
            layer_in if policy.decoder_layer_input == "offload" else 0
        )
    dev = layer_in if policy.decoder_layer_input == "device" else 0
    host = layer_in - dev
    if r == "custom":
        for where, size in ((policy.context, 4 * (N * H + N)), (policy.qkv, a * (N + 2 * K) * H)):
            if where == "device":
                dev += size
            elif where == "offload":
                host += size
    return dev, host


def _non_mlp_residual_bytes_per_token(cfg: ModelDims, dtype: str) -> int:
    """The ``none`` saved set of one block without its six ``[F]`` SwiGLU tensors: the norms'
    inputs, outputs and statistics, q/k/v, positions and segment ids, the flash output and
    logsumexp (:func:`saved_bytes_per_token_per_layer`), per token."""
    full = saved_bytes_per_token_per_layer(cfg, ActivationPolicy("none"), dtype)[0]
    return full - 6 * cfg.mlp_dim * dtype_bytes(dtype)


def layer_working_bytes_per_token(
    cfg: ModelDims, policy: ActivationPolicy | None = None, dtype: str = "bfloat16"
) -> int:
    """Bytes per token live in the MLP phase of one block's backward, beyond the saved activations
    (as saved) and beyond the attention's own residuals
    (:func:`~lcx.cost.attention_memory.attention_kernel_residual_bytes`).

    In the backward of block ``l`` (``lcx.models.llama``: the layer scan's transpose, last layer
    first) JAX first rebuilds the block's residuals -- replaying its forward (remat), copying
    offloaded ones back, or reading saved ones out of the scan's stacked ``[L, ...]`` arrays --
    and then differentiates it in reverse: the MLP first, attention last. While the MLP is
    differentiated every residual of the block is live, because attention's are still to be
    used. So this phase holds, per token (``a`` activation bytes, ``F`` MLP width):

    - the block's residuals outside the MLP (the ``none`` saved set less its six ``[F]``
      tensors: norm inputs, outputs and statistics, q/k/v, flash output and logsumexp), for
      EVERY policy: replayed, copied back from the host, or copied out of the layer scan's
      stacks -- the backward reads them with matmuls, and XLA materialises a dynamic slice of a
      loop-carried stack that feeds a matmul (a slice read by an elementwise fusion is fused
      into it instead, which is why the saved ``[F]`` tensors of ``none`` cost nothing here);
    - the MLP's replayed ``[F]`` tensors: the gate and up projections and silu(gate), ``3 F a``,
      when the MLP is replayed (``full``, ``custom``); silu(gate), ``F a``, for the dots
      policies (they keep the projections); none for ``none``;
    - the SwiGLU backward's ``[T, F]`` cotangents: dh (from ``w_down``), d_up
      ``= dh * silu(gate)``, d_gate (silu's derivative applied; d_silu fuses into it), and
      copies of d_up and d_gate transposed for the weight-gradient GEMMs ``x^T d``: ``5 F a``;
    - the residual stream's cotangent into and out of the block, ``2 D a``.

    These are the values XLA's buffer assignment shows live at the peak of the compiled train
    step (``experiments/ledger_vs_compiled.py`` dumps it); the attention backward's
    cotangent-independent buffers, live here too, are
    :func:`~lcx.cost.attention_memory.kernel_backward_prologue_bytes`.

    Args:
      cfg: model dimensions.
      policy: the remat policy (default ``full``).
      dtype: activation (compute) dtype; cotangents have their primal's dtype.
    """
    policy = ActivationPolicy() if policy is None else policy
    a, F = dtype_bytes(dtype), cfg.mlp_dim
    replay = {"none": 0, "dots_saveable": 1, "dots_with_no_batch_dims_saveable": 1}.get(policy.remat, 3)
    return _non_mlp_residual_bytes_per_token(cfg, dtype) + replay * F * a + 5 * F * a + 2 * cfg.d_model * a


def attention_residual_bytes_per_token(
    cfg: ModelDims, policy: ActivationPolicy | None = None, dtype: str = "bfloat16"
) -> int:
    """Bytes per token of the block's residuals live while its attention is differentiated (the
    MLP's are dead by then): the attention norm's output ``D a`` (for the q/k/v weight
    gradients), q, k, v after RoPE ``(N + 2K) H a`` and the flash residuals, float32 output and
    logsumexp ``4 (N H + N)`` -- replayed, copied back or copied out of the layer scan's stacks,
    whatever the policy (see :func:`layer_working_bytes_per_token`) -- plus the residual
    stream's cotangent in and out, ``2 D a``.

    ``policy`` is accepted for symmetry with :func:`layer_working_bytes_per_token`; the bytes do
    not depend on it."""
    D, N, K, H = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    a = dtype_bytes(dtype)
    return D * a + (N + 2 * K) * H * a + 4 * (N * H + N) + 2 * D * a


XLA_CPU_FUSED_LOSS_ROWS = 4096
"""Tokens per tile from which XLA:CPU fuses the loss backward's matmul, exponential and cotangent
into one YNNPACK fusion written in place (:func:`logits_phase_bytes`); found by bisecting the
compiled step (3,584 tokens: four tiles; 4,096: three untiled, two tiled; V = 4,096, 32,064 and
128,256 alike), not read from XLA's source."""


def logits_phase_bytes(
    cfg: ModelDims,
    *,
    tokens: int,
    vocab_tiling: int = 1,
    head_copy: bool = True,
    dtype: str = "bfloat16",
    xla_cpu: bool = False,
) -> int:
    """Peak bytes of the loss phase on one device beyond the state and saved activations: the
    backward of the output head and loss (``lcx.training.step``'s ``loss_fn``), between the layer
    scan's forward and its backward.

    With ``t = tokens / vocab_tiling`` tokens per tile (``tokens = b T``, the local ``b``
    sequences of ``T`` tokens; ``vocab_tiling`` = 1: the whole local sequence is one tile), the
    values XLA's buffer assignment of the compiled train step holds at the phase's peak (the
    backward of one tile: ``lcx.training.loss.vocab_tiled_loss_sum_and_count`` replays the
    tile's logits inside its checkpointed scan body; untiled, ``loss_sum_and_count``'s backward
    of the whole logits) are:

    - four float32 ``[b, t, V]`` tiles, ``4 * 4 t V``: the (replayed) logits or their
      exponential, the cotangent of the target pick (``take_along_axis``'s transpose, a scatter
      into zeros), the logits' cotangent (softmax minus one-hot) and its transposed copy for the
      weight-gradient GEMM ``d head = h^T d logits``. With ``xla_cpu`` and tiles of at least
      :data:`XLA_CPU_FUSED_LOSS_ROWS` tokens XLA:CPU instead computes the cotangent in one
      YNNPACK fusion with the (replayed) matmul and exponential, written in place into the
      scatter's buffer: two tiles when tiled (the cotangent and its transposed copy), three
      untiled (the forward's logits, still read by the target pick, and the exponential too);
    - the output head ``[D, V]`` as the matmul reads it, ``D V a``, when it is a copy
      (``head_copy``: the head's parameter is sharded, so each device all-gathers it, or it is
      cast to the compute dtype);
    - the final RMSNorm's residuals, its float32 input and normalised input (``2 x 4 D`` per
      token), and its output ``h`` with its cotangent, ``2 D a`` per token.

    Counted on XLA:CPU (``experiments/vocab_tiling_offload.py`` compiles the train step for
    ``vocab_tiling`` 1, 4, 16 and prints the largest ``V``-sized buffer); the gradient of the
    head accumulates into its sharded gradient, counted in ``grads``.

    Args:
      cfg: model dimensions (``V`` = ``cfg.vocab_size``, ``D`` = ``cfg.d_model``).
      tokens: local tokens of the step on one device, ``b T``.
      vocab_tiling: tiles N (``memory.vocab_tiling``); a tile of a sequence ``N`` does not divide
        (which ``lcx.train`` refuses) is rounded up.
      head_copy: whether the matmul reads a gathered or cast copy of the head.
      dtype: compute dtype (``a`` bytes); the logits are float32 whatever it is.
      xla_cpu: price XLA:CPU's fusion of large tiles (above).

    Raises:
      ValueError: ``vocab_tiling`` < 1, or an unknown dtype.
    """
    if vocab_tiling < 1:
        raise ValueError(f"vocab_tiling must be >= 1, got {vocab_tiling}")
    a, D, V = dtype_bytes(dtype), cfg.d_model, cfg.vocab_size
    t = -(-tokens // vocab_tiling)
    tiles = 4 if not (xla_cpu and t >= XLA_CPU_FUSED_LOSS_ROWS) else (2 if vocab_tiling > 1 else 3)
    return tiles * 4 * t * V + (D * V * a if head_copy else 0) + tokens * (2 * 4 * D + 2 * D * a)
