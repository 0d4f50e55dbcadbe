"""Per-device memory: parameters, gradients, optimizer state, saved activations, working memory.

Everything here is pure arithmetic on a model config and a :class:`~lcx.sharding.Plan`: the
parameter shapes mirror ``lcx.models.llama`` field for field (a test checks them against the
abstract model), and each array's per-device shard comes from the plan's parameter rules through
:func:`lcx.sharding.describe.layout_arrays`. No array of the sequence length is ever built, so a
14M-token plan costs microseconds.

Activation accounting follows the block of ``lcx.models.llama`` (pre-norm GQA attention + SwiGLU
MLP, scanned over layers) and the MaxText remat vocabulary (``remat_policy``, and per-tensor
``decoder_layer_input`` / ``context`` placement ``device | offload | remat``, MaxText
``base.yml``). Host offload moves saved tensors to host memory; they leave HBM.
:meth:`ActivationPolicy.from_model` reads the policy ``lcx.models`` runs from a model config
(``model.remat`` and its ``model.remat_*`` placements).

Where the compiler puts what (``memory_breakdown(..., memory_kinds=...)``): an accelerator
compiler (TPU, GPU: XLA's host-offload passes) honours JAX's memory kinds, so offloaded tensors
live in ``pinned_host`` memory and ``lcx.training.step``'s ``jax.device_put`` calls are copies
into HBM. XLA:CPU runs ``strip-memory-placement-annotations`` instead: no copy is made,
``pinned_host`` arguments (``S(5)`` in the compiled module's ``entry_computation_layout``) are
read in place and tensors the remat policy offloads stay ordinary temporaries.
``memory_kinds=False`` prices that program.
"""

from __future__ import annotations

import dataclasses
import math

from lcx.cost.flops import ModelDims
from lcx.sharding import Plan
from lcx.sharding import axes as ax
from lcx.sharding.describe import ArrayInfo, layout_arrays

DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4}

REMAT_POLICIES: tuple[str, ...] = ("none", "dots_saveable", "dots_with_no_batch_dims_saveable", "full", "custom")
"""Remat policies the ledger prices, those of ``lcx.models``: four ``jax.checkpoint_policies`` and
MaxText's ``custom`` (only the tensors named in :class:`ActivationPolicy` are kept, each on device
or offloaded)."""

PLACEMENTS: tuple[str, ...] = ("device", "offload", "remat")


def _bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


# ---------------------------------------------------------------------------------------------- arrays
def param_arrays(cfg: ModelDims, param_dtype: str = "float32", *, tie_embeddings: bool = False) -> list[ArrayInfo]:
    """Every parameter kind of the Llama model with its logical axes and global shape.

    Mirrors ``lcx.models.llama`` (Embedding, stacked Blocks with a leading ``layers`` axis and,
    if ``cfg.attention_sinks``, their ``[layers, heads]`` sink logits, final RMSNorm, untied
    head), so :func:`lcx.sharding.describe.describe` can lay them out
    without building a model.
    """
    D, N, K, H, F, V, L = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.mlp_dim,
                           cfg.vocab_size, cfg.n_layers)
    b = _bytes(param_dtype)
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
    if getattr(cfg, "attention_sinks", False):  # one sink logit per query head and layer
        out.append(ArrayInfo("sinks", "param", (Ly, Hs), (L, N), b))
    return out


def activation_arrays(cfg: ModelDims, seq_len: int, global_batch: int, dtype: str = "bfloat16") -> list[ArrayInfo]:
    """Activation kinds of one layer (global shapes): tokens ``[batch, seq]`` int32, residual
    ``[batch, seq, embed]``, q ``[batch, seq, heads, head_dim]``, k/v ``[batch, seq, kv_heads,
    head_dim]``, MLP hidden ``[batch, seq, mlp]``, logits ``[batch, seq, vocab]`` float32."""
    B, S = global_batch, seq_len
    a = _bytes(dtype)
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

    327,680 bytes (0.3125 MiB) for Llama 3 70B in 16-bit (FIELD_NOTES section 4).
    """
    return 2 * n_layers * n_kv_heads * head_dim * bytes_per_element


# ---------------------------------------------------------------------------------------------- policy
@dataclasses.dataclass(frozen=True)
class ActivationPolicy:
    """What the backward pass finds saved, and where.

    Attributes:
      remat: one of :data:`REMAT_POLICIES`.
      decoder_layer_input: placement of each block's input ``[b, T, D]`` (``device`` or
        ``offload``; MaxText ``decoder_layer_input``). Every policy but ``none`` keeps it.
      context: ``custom`` only: placement of the flash-attention residuals, the float32 output
        ``[b, T, N, H]`` and logsumexp ``[b, T, N]`` (MaxText ``context``, ``lcx.models``
        ``remat_context``): ``device``/``offload`` keep them (attention is not replayed),
        ``remat`` replays it.
      offload_optimizer: optimizer state in host memory between steps (MaxText
        ``optimizer_memory_host_offload``; ``lcx.train``'s ``memory.offload_optimizer``): copied
        to the device for the update only.
      offload_params: parameters in host memory between steps (MaxText
        ``parameter_memory_host_offload``; ``memory.offload_params``): copied to the device at
        the start of the step, where they stay until the update.
      vocab_tiling: tiles N of the local sequence the output head and loss are computed in
        (MaxText ``num_vocab_tiling``; ``memory.vocab_tiling``,
        ``lcx.training.loss.vocab_tiled_loss_sum_and_count``); 1: the logits are computed whole.
      qkv: ``custom`` only: placement of q ``[b, T, N, H]`` and k, v ``[b, T, K, H]`` after RoPE
        (``lcx.models`` ``remat_qkv``): ``device``/``offload`` keep them, ``remat`` replays the
        norm, projections and RoPE that make them.
    """

    remat: str = "full"
    decoder_layer_input: str = "device"
    context: str = "remat"
    offload_optimizer: bool = False
    offload_params: bool = False
    vocab_tiling: int = 1
    qkv: str = "remat"

    def __post_init__(self):
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"unknown remat policy {self.remat!r}; choose one of {REMAT_POLICIES}")
        if self.decoder_layer_input not in ("device", "offload"):
            raise ValueError(f"decoder_layer_input must be 'device' or 'offload', got {self.decoder_layer_input!r}")
        if self.context not in PLACEMENTS:
            raise ValueError(f"context must be one of {PLACEMENTS}, got {self.context!r}")
        if self.qkv not in PLACEMENTS:
            raise ValueError(f"qkv must be one of {PLACEMENTS}, got {self.qkv!r}")
        n = self.vocab_tiling
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"vocab_tiling must be a whole number >= 1 (1: untiled), got {n!r}")

    @classmethod
    def from_model(cls, cfg, **overrides) -> ActivationPolicy:
        """The policy a model config trains with: ``model.remat`` and, for ``custom``, its
        placements ``model.remat_layer_input``, ``model.remat_context``, ``model.remat_qkv``
        (:class:`lcx.models.ModelConfig`; a config without them gets the defaults).

        Args:
          cfg: a model config.
          overrides: fields to set instead (e.g. ``offload_optimizer=True``, or a remat policy
            the model does not run, to price it).

        Raises:
          ValueError: an unknown policy or placement.
        """
        fields = dict(
            remat=cfg.remat,
            decoder_layer_input=getattr(cfg, "remat_layer_input", "device"),
            context=getattr(cfg, "remat_context", "remat"),
            qkv=getattr(cfg, "remat_qkv", "remat"),
        )
        return cls(**{**fields, **overrides})

    @property
    def keeps_context(self) -> bool:
        return self.remat == "custom" and self.context != "remat"

    @property
    def label(self) -> str:
        parts = [self.remat]
        if self.decoder_layer_input == "offload":
            parts.append("in>host")
        if self.remat == "custom":
            parts.append(f"ctx={self.context}")
            if self.qkv != "remat":
                parts.append(f"qkv={self.qkv}")
        if self.offload_optimizer:
            parts.append("opt>host")
        if self.offload_params:
            parts.append("par>host")
        if self.vocab_tiling > 1:
            parts.append(f"vt{self.vocab_tiling}")
        return ",".join(parts)


def saved_bytes_per_token_per_layer(cfg: ModelDims, policy: ActivationPolicy, dtype: str = "bfloat16") -> tuple[int, int]:
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
    a = _bytes(dtype)
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
    return full - 6 * cfg.mlp_dim * _bytes(dtype)


def layer_working_bytes_per_token(cfg: ModelDims, policy: ActivationPolicy | None = None, dtype: str = "bfloat16") -> int:
    """Bytes per token live in the MLP phase of one block's backward, beyond the saved activations
    (as saved) and beyond the attention's own residuals (:func:`attention_kernel_residual_bytes`).

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
    cotangent-independent buffers, live here too, are :func:`kernel_backward_prologue_bytes`.

    Args:
      cfg: model dimensions.
      policy: the remat policy (default ``full``).
      dtype: activation (compute) dtype; cotangents have their primal's dtype.
    """
    policy = ActivationPolicy() if policy is None else policy
    a, F = _bytes(dtype), cfg.mlp_dim
    replay = {"none": 0, "dots_saveable": 1, "dots_with_no_batch_dims_saveable": 1}.get(policy.remat, 3)
    return _non_mlp_residual_bytes_per_token(cfg, dtype) + replay * F * a + 5 * F * a + 2 * cfg.d_model * a


def attention_kernel_residual_bytes(
    cfg: ModelDims,
    *,
    strategy: str,
    seq_len: int,
    local_batch: int,
    context_degree: int,
    ulysses_degree: int = 1,
    tensor_degree: int = 1,
    dtype: str = "bfloat16",
) -> int:
    """Bytes a strategy's attention residuals exceed the local q, k, v (which the layer's saved
    set already counts): what the kernel's custom VJP saves is the K/V it was CALLED with.

    - ``allgather``: the gathered K/V, ``2 b (S - T) Kl H a`` more, and the gathered positions
      and segment ids, ``2 b S`` int32;
    - ``a2a`` (degree U = P): k/v of ``Kr / U`` kv heads over all S tokens instead of ``Kl``
      heads over T (more when kv heads are replicated, ``Kr = max(Kl, U)``), and the four
      gathered position / segment arrays ``4 b S`` int32 (q is the same size either way);
    - ``usp``: the same over the Ulysses group's ``L = U T`` tokens;
    - ``ring``: nothing (each step's K/V is fetched again in the backward).

    Raises:
      ValueError: unknown strategy.
    """
    S, b, P = seq_len, local_batch, context_degree
    K, H = max(1, cfg.n_kv_heads // tensor_degree), cfg.head_dim
    a = _bytes(dtype)
    T = S // P
    if strategy == "allgather":
        return 2 * b * (S - T) * K * H * a + 2 * b * S * 4
    if strategy in ("a2a", "usp"):
        U = P if strategy == "a2a" else ulysses_degree
        if U == 1:
            return 0
        kh, L = max(K, U) // U, T * U
        return max(0, 2 * b * (L * kh - T * K) * H * a) + 4 * b * L * 4
    if strategy == "ring":
        return 0
    raise ValueError(f"unknown strategy {strategy!r}")


def attention_residual_bytes_per_token(cfg: ModelDims, policy: ActivationPolicy | None = None,
                                       dtype: str = "bfloat16") -> int:
    """Bytes per token of the block's residuals live while its attention is differentiated (the
    MLP's are dead by then): the attention norm's output ``D a`` (for the q/k/v weight
    gradients), q, k, v after RoPE ``(N + 2K) H a`` and the flash residuals, float32 output and
    logsumexp ``4 (N H + N)`` -- replayed, copied back or copied out of the layer scan's stacks,
    whatever the policy (see :func:`layer_working_bytes_per_token`) -- plus the residual
    stream's cotangent in and out, ``2 D a``.

    ``policy`` is accepted for symmetry with :func:`layer_working_bytes_per_token`; the bytes do
    not depend on it."""
    D, N, K, H = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    a = _bytes(dtype)
    return D * a + (N + 2 * K) * H * a + 4 * (N * H + N) + 2 * D * a


def kernel_backward_bytes(
    *,
    kernel: str,
    local_batch: int,
    q_len: int,
    kv_len: int,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    block_q: int = 512,
    block_kv: int = 512,
    block_q_dkv: int | None = None,
    block_kv_dkv: int | None = None,
    dtype: str = "bfloat16",
) -> int:
    """Bytes one attention kernel's backward call holds besides its inputs (q, k, v, out, lse).

    ``xla`` (``lcx.attention.kernels.xla.XlaKernel.backward``: ``backward_start``, one
    ``backward_step`` over all K/V blocks, ``backward_finish``), all float32, with ``b, t, s, n,
    k, h`` = batch, ``q_len``, ``kv_len``, heads, kv heads, head width: the incoming cotangent
    dout ``b t n h`` (``a`` bytes) and, unless it is already float32, its float32 copy; the
    scaled float32 q and the blocked dQ accumulator, ``2 b t n h`` (at the end the accumulator
    and the unblocked dQ); logsumexp and delta, ``2 b t n``; the dK/dV accumulators the kernel
    adds into, ``2 b s k h``; and the tiles of one (query block, key block) step,
    ``[b, k, bk, G bq]`` with ``G = n / k`` (GEMM rows): the probabilities, dP and dS are live
    together (the logits are consumed by the exp that makes the probabilities),
    ``3 b n bq bk``; ``bq, bk`` are the BACKWARD's blocks, ``block_q_dkv`` / ``block_kv_dkv``
    (None: ``block_q`` / ``block_kv``), clamped to the lengths
    (``lcx.attention.kernels.xla.block_size``).

    ``splash`` (Pallas): tiles live in VMEM (0 HBM); dout and the float32 dq, dk, dv outputs.

    Raises:
      ValueError: unknown kernel.
    """
    b, t, s, n, k, h = local_batch, q_len, kv_len, q_heads, kv_heads, head_dim
    a, f32 = _bytes(dtype), 4
    dout = b * t * n * h * a
    if kernel == "xla":
        bq = _block_size(t, block_q if block_q_dkv is None else block_q_dkv)
        bk = _block_size(s, block_kv if block_kv_dkv is None else block_kv_dkv)
        dout_f32 = 0 if a == f32 else b * t * n * h * f32
        return dout + dout_f32 + f32 * b * (2 * t * n * h + 2 * t * n + 2 * s * k * h) + 3 * f32 * b * n * bq * bk
    if kernel == "splash":
        return dout + f32 * b * (t * n * h + 2 * s * k * h)
    raise ValueError(f"unknown kernel {kernel!r}")


def _block_size(length: int, block: int) -> int:
    # lcx.attention.kernels.xla.block_size (the ledger reads no JAX module): the largest divisor
    # of length that is <= block
    bs = max(1, min(block, length))
    while length % bs:
        bs -= 1
    return bs


# ---------------------------------------------------------------------------------------------- attention
def _kernel_call_shape(strategy: str, S: int, P: int, U: int, N: int, K: int) -> tuple[int, int, int, int]:
    """``(query tokens, key tokens, q heads, kv heads)`` of one kernel call of ``strategy`` on a
    device holding ``T = S / P`` tokens of ``N`` q and ``K`` kv heads (see
    :func:`attention_working_bytes`; kv heads replicated up to the Ulysses degree).

    Raises:
      ValueError: unknown strategy.
    """
    T = S // P
    if strategy == "allgather":
        return T, S, N, K
    if strategy == "a2a":
        return S, S, N // P, max(K, P) // P
    if strategy == "ring":
        return T, T, N, K
    if strategy == "usp":
        return T * U, T * U, N // U, max(K, U) // U
    raise ValueError(f"unknown strategy {strategy!r}")


def kernel_backward_prologue_bytes(*, kernel: str, local_batch: int, q_len: int, kv_len: int, q_heads: int,
                                   kv_heads: int, head_dim: int) -> int:
    """Bytes of an attention kernel's backward that do not depend on the incoming cotangent, so
    XLA creates them as soon as their inputs exist -- during the MLP's backward, before
    attention's own phase (its schedulers start independent work early: XLA:CPU's default
    concurrency-optimised one does, as the buffer assignment of the compiled train step shows).

    ``xla``: the scaled float32 q and the blocked float32 dQ accumulator, ``2 b t n h``, and the
    zeroed float32 dK/dV accumulators, ``2 b s k h`` (part of :func:`kernel_backward_bytes`).
    ``splash``: 0 (the Pallas call allocates its accumulators itself).

    Raises:
      ValueError: unknown kernel.
    """
    b, t, s, n, k, h = local_batch, q_len, kv_len, q_heads, kv_heads, head_dim
    if kernel == "xla":
        return 4 * b * (2 * t * n * h + 2 * s * k * h)
    if kernel == "splash":
        return 0
    raise ValueError(f"unknown kernel {kernel!r}")


def attention_prologue_bytes(cfg: ModelDims, *, strategy: str, kernel: str, seq_len: int, local_batch: int,
                             context_degree: int, ulysses_degree: int = 1, tensor_degree: int = 1) -> int:
    """:func:`kernel_backward_prologue_bytes` of ``strategy``'s kernel call on one device: the
    part of the attention phase already live in the MLP phase of the same block's backward.

    Raises:
      ValueError: unknown strategy or kernel.
    """
    N, K = cfg.n_heads // tensor_degree, max(1, cfg.n_kv_heads // tensor_degree)
    tq, tk, nq, nk = _kernel_call_shape(strategy, seq_len, context_degree, ulysses_degree, N, K)
    return kernel_backward_prologue_bytes(kernel=kernel, local_batch=local_batch, q_len=tq, kv_len=tk, q_heads=nq,
                                          kv_heads=nk, head_dim=cfg.head_dim)


def kernel_forward_bytes(*, kernel: str, local_batch: int, q_len: int, kv_len: int, q_heads: int, kv_heads: int,
                         head_dim: int, block_q: int = 512, block_kv: int = 512) -> int:
    """Bytes one attention kernel's forward call holds besides its inputs.

    ``xla`` (``XlaKernel.forward_start`` / ``forward_step`` / ``forward_finish``), float32, with
    ``b, t, n, h`` = batch, ``q_len``, heads, head width: the scaled q and the unnormalised output
    accumulator, ``2 b t n h``; the running max and sum, ``2 b t n``; and the logits and
    probabilities of one (query block, key block) step, ``2 b n bq bk`` (the forward's blocks,
    clamped to the lengths).

    ``splash`` (Pallas): tiles in VMEM; the float32 output and logsumexp, ``b t n (h + 1)``.

    Raises:
      ValueError: unknown kernel.
    """
    b, t, s, n, h = local_batch, q_len, kv_len, q_heads, head_dim
    if kernel == "xla":
        bq, bk = _block_size(t, block_q), _block_size(s, block_kv)
        return 4 * b * (2 * t * n * h + 2 * t * n) + 2 * 4 * b * n * bq * bk
    if kernel == "splash":
        return 4 * b * t * n * (h + 1)
    raise ValueError(f"unknown kernel {kernel!r}")


def _strategy_buffers(cfg: ModelDims, strategy: str, S: int, b: int, P: int, U: int, tp: int, dtype: str, *,
                      backward: bool) -> tuple[int, tuple[int, int, int, int]]:
    """``(bytes, kernel call shape)`` of a strategy's own buffers in one attention layer (see
    :func:`attention_working_bytes` and :func:`attention_forward_bytes`): the gathered K/V
    (all-gather), the head-layout q/k/v (Ulysses), the K/V, positions and segment ids in flight
    (ring) and, in the ``backward``, the ring's next hop of the float32 dK/dV accumulators; USP
    both, over ``L = U T`` tokens.

    Raises:
      ValueError: unknown strategy.
    """
    N, K, H = cfg.n_heads // tp, max(1, cfg.n_kv_heads // tp), cfg.head_dim
    a = _bytes(dtype)
    shape = tq, tk, nq, nk = _kernel_call_shape(strategy, S, P, U, N, K)

    def ring(length, kh):
        return 2 * b * length * kh * H * a + 2 * b * length * 4 + (2 * b * length * kh * H * 4 if backward else 0)

    if strategy == "allgather":
        work = 2 * b * S * K * H * a + 2 * b * S * 4
    elif strategy == "a2a":
        work = b * S * H * (nq + 2 * nk) * a + 4 * b * S * 4
    elif strategy == "ring":
        work = ring(S // P, K)
    else:  # usp
        work = b * tq * H * (nq + 2 * nk) * a + 4 * b * tq * 4 + ring(tq, nk)
    return work, shape


def attention_forward_bytes(
    cfg: ModelDims,
    *,
    strategy: str,
    kernel: str,
    seq_len: int,
    local_batch: int,
    context_degree: int,
    ulysses_degree: int = 1,
    tensor_degree: int = 1,
    block_q: int = 512,
    block_kv: int = 512,
    dtype: str = "bfloat16",
) -> int:
    """Peak transient bytes of ONE attention layer's forward on one device: the strategy's
    buffers (all-gather: the gathered K/V and positions / segment ids; Ulysses: q/k/v of ``N/U``
    heads over all tokens and the gathered positions / segment ids; ring: the K/V, positions and
    segment ids in flight to the next step; USP: both, over ``L = U T`` tokens) plus the kernel's
    forward (:func:`kernel_forward_bytes`) on the shapes it is called with. Its phase matters when
    the forward's blocks are larger than the backward's (``plan.attention.block_*_dkv``).

    Raises:
      ValueError: unknown strategy or kernel.
    """
    b, H = local_batch, cfg.head_dim
    work, (tq, tk, nq, nk) = _strategy_buffers(cfg, strategy, seq_len, b, context_degree, ulysses_degree,
                                               tensor_degree, dtype, backward=False)
    return int(work + kernel_forward_bytes(kernel=kernel, local_batch=b, q_len=tq, kv_len=tk, q_heads=nq,
                                           kv_heads=nk, head_dim=H, block_q=block_q, block_kv=block_kv))


def attention_working_bytes(
    cfg: ModelDims,
    *,
    strategy: str,
    kernel: str,
    seq_len: int,
    local_batch: int,
    context_degree: int,
    ulysses_degree: int = 1,
    tensor_degree: int = 1,
    block_q: int = 512,
    block_kv: int = 512,
    block_q_dkv: int | None = None,
    block_kv_dkv: int | None = None,
    dtype: str = "bfloat16",
) -> int:
    """Peak transient bytes of ONE attention layer's backward on one device, beyond the
    residuals it reads (q, k, v, flash output and logsumexp of the local tokens: see
    :func:`attention_residual_bytes_per_token`).

    Per strategy (``lcx.attention.strategies``), with ``T = S / P`` local tokens, ``b`` local
    sequences, ``a`` activation bytes, ``Nl = N / tp``, ``Kl = K / tp``, plus the kernel's own
    backward (:func:`kernel_backward_bytes`) on the shapes it is called with:

    - ``allgather``: the gathered K/V ``2 b S Kl H a`` and positions and segment ids
      (``2 b S`` int32); the kernel on ``T`` queries x ``S`` keys (its dK/dV are full-length
      before the reduce-scatter);
    - ``a2a`` (Ulysses, degree U = P): q/k/v of ``N/U`` heads over all S tokens (kv heads
      replicated up to U) and the gathered positions and segment ids (``4 b S`` int32); the
      kernel on S x S tokens of ``N/U`` heads;
    - ``ring``: the K/V (+ positions, segment ids) in flight to the next step and the next
      hop of the float32 dK/dV accumulators (``2 b T Kl H 4``); the kernel on T x T, whose dQ
      and dK/dV accumulators are the ring's (``lcx.attention.strategies.ring``: the kernel adds
      into them in place, step after step);
    - ``usp``: the all-to-all over U as for a2a (q/k/v of ``N/U`` heads over ``L = U T``
      tokens), then the ring's buffers on blocks of ``L`` tokens of ``Kr / U`` kv heads; the
      kernel on L x L.

    The kernel's tiles are those of its backward blocks, ``block_q_dkv`` x ``block_kv_dkv``
    (None: ``block_q`` / ``block_kv``; ``plan.attention``'s keys of those names).

    Raises:
      ValueError: unknown strategy or kernel.
    """
    b, H = local_batch, cfg.head_dim
    work, (tq, tk, nq, nk) = _strategy_buffers(cfg, strategy, seq_len, b, context_degree, ulysses_degree,
                                               tensor_degree, dtype, backward=True)
    return int(work + kernel_backward_bytes(kernel=kernel, local_batch=b, q_len=tq, kv_len=tk, q_heads=nq,
                                            kv_heads=nk, head_dim=H, block_q=block_q, block_kv=block_kv,
                                            block_q_dkv=block_q_dkv, block_kv_dkv=block_kv_dkv, dtype=dtype))


XLA_CPU_FUSED_LOSS_ROWS = 4096
"""Tokens per tile from which XLA:CPU fuses the loss backward's matmul, exponential and cotangent
into one YNNPACK fusion written in place (:func:`logits_phase_bytes`); found by bisecting the
compiled step (3,584 tokens: four tiles; 4,096: three untiled, two tiled; V = 4,096, 32,064 and
128,256 alike), not read from XLA's source."""


def logits_phase_bytes(cfg: ModelDims, *, tokens: int, vocab_tiling: int = 1, head_copy: bool = True,
                       dtype: str = "bfloat16", xla_cpu: bool = False) -> int:
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
    a, D, V = _bytes(dtype), cfg.d_model, cfg.vocab_size
    t = -(-tokens // vocab_tiling)
    tiles = 4 if not (xla_cpu and t >= XLA_CPU_FUSED_LOSS_ROWS) else (2 if vocab_tiling > 1 else 3)
    return tiles * 4 * t * V + (D * V * a if head_copy else 0) + tokens * (2 * 4 * D + 2 * D * a)


# ---------------------------------------------------------------------------------------------- totals
@dataclasses.dataclass(frozen=True)
class MemoryBreakdown:
    """Per-device memory of one training step, by component, in bytes.

    The peak is counted as phases of the step, because the transients of different phases are
    never live together: ``state + max(activations + max(layer_working, attention, logits,
    attention_forward), update)``.

    - state (parameters, gradients, optimizer) and the saved activations live throughout;
    - ``attention_forward``: an attention layer's forward (its strategy's buffers and the
      kernel's forward tiles; the peak only when the forward's blocks exceed the backward's);
    - ``logits``: the loss phase (after the layer scan's forward, before its backward);
    - ``layer_working``: the MLP phase of one block's backward, when all of that block's
      residuals are live (:func:`layer_working_bytes_per_token`), and so are the attention
      backward's cotangent-independent buffers (:func:`attention_prologue_bytes`);
    - ``attention``: the attention phase of the same block's backward (the MLP's residuals are
      dead): the residuals attention still reads
      (:func:`attention_residual_bytes_per_token`) plus its strategy's and kernel's backward
      (:func:`attention_working_bytes`);
    - ``update``: the optimizer update, after the backward (the saved activations are dead):
      with the optimizer state offloaded, its device copy (``lcx.training.step`` puts it on the
      device right before ``optimizer.update``).

    Attributes:
      params, grads, optimizer: state under the plan's parameter sharding on device during the
        forward and backward. Offloaded parameters are on device then too (the step copies them
        in at its start), unless the compiler strips memory kinds (XLA:CPU reads them in
        place); offloaded optimizer state is not (0; see ``update`` and ``host``).
      activations: saved activations of all layers kept on device.
      layer_working: the MLP phase's transient.
      attention: the attention phase's transient.
      logits: the loss phase's transient (:func:`logits_phase_bytes`: four float32
        ``[b, T / vocab_tiling, V]`` tiles, the gathered head, the final norm's residuals).
      host: bytes per device in host memory (offloaded activations, optimizer, parameters).
      attention_forward: the forward phase's transient: one attention layer's forward
        (:func:`attention_forward_bytes`), on top of the saved activations (all layers' at the
        last layer, an upper bound).
      update: the update phase's bytes beyond ``state``: the offloaded optimizer state's device
        copy (0 without optimizer offload, or when the compiler strips memory kinds).
    """

    params: int
    grads: int
    optimizer: int
    activations: int
    layer_working: int
    attention: int
    logits: int
    host: int
    attention_forward: int = 0
    update: int = 0

    @property
    def state(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def working(self) -> int:
        """The largest phase's transient (the phases are not live together)."""
        return max(self.layer_working, self.attention, self.logits, self.attention_forward)

    @property
    def total(self) -> int:
        """Peak HBM per device: state + the larger of (saved activations + the largest backward
        or forward phase's transient) and the update phase's bytes."""
        return self.state + max(self.activations + self.working, self.update)

    def as_dict(self) -> dict[str, int]:
        d = dataclasses.asdict(self)
        d["total"] = self.total
        return d


def param_bytes_per_device(plan: Plan, n_devices: int, cfg: ModelDims, param_dtype: str = "float32",
                           *, tie_embeddings: bool = False) -> int:
    """Bytes of parameters per device under the plan's parameter rules (ceil-divided shards)."""
    return sum(r.bytes_per_device for r in layout_arrays(plan, n_devices, param_arrays(cfg, param_dtype, tie_embeddings=tie_embeddings)))


def memory_breakdown(
    cfg: ModelDims,
    plan: Plan,
    n_devices: int,
    *,
    seq_len: int,
    global_batch: int,
    policy: ActivationPolicy,
    dtype: str = "bfloat16",
    param_dtype: str = "float32",
    optimizer_states: int = 2,
    tie_embeddings: bool = False,
    memory_kinds: bool = True,
) -> MemoryBreakdown:
    """Per-device memory of a training step for ``cfg`` under ``plan`` on ``n_devices``.

    Host offload of state, as ``lcx.training.step.make_steps`` compiles it
    (``memory.offload_params`` / ``memory.offload_optimizer``): between steps the offloaded
    parameters / optimizer state are ``pinned_host`` arguments and outputs of the step (``host``,
    each under the plan's parameter sharding). Inside the step the parameters are put on the
    device at its start and stay there until the update (``params`` is unchanged by the
    offload); the optimizer state is put on the device after the backward, for the update only
    (``optimizer`` 0, ``update`` its device copy). With ``memory_kinds=False`` (XLA:CPU, whose
    ``strip-memory-placement-annotations`` pass removes every placement) no copy exists: the
    step reads the ``pinned_host`` arguments in place (``params`` 0 when offloaded, ``update``
    0) and the activations the remat policy offloads stay ordinary temporaries (counted in
    ``activations``, not ``host``).

    Args:
      cfg: model dimensions.
      plan: the sharding plan (mesh sizes resolved for ``n_devices``).
      seq_len: tokens per sequence S.
      global_batch: sequences per step B.
      policy: remat / offload / vocabulary-tiling choices.
      dtype: activation (compute) dtype.
      param_dtype: parameter, gradient and optimizer-state dtype.
      optimizer_states: optimizer tensors per parameter (AdamW: mu and nu = 2; optax keeps them
        in the parameter dtype).
      tie_embeddings: the output head is the embedding's transpose (no ``head`` parameter).
      memory_kinds: whether the compiler honours JAX memory kinds (TPU, GPU: True). False prices
        the program XLA:CPU compiles: placements stripped (above), and its fusion of the loss
        backward on tiles of 4,096 tokens or more (:func:`logits_phase_bytes` ``xla_cpu``).

    Raises:
      PlanError: the plan's mesh does not fit ``n_devices``.
    """
    shape = plan.mesh_shape(n_devices)
    P = plan.context_degree(n_devices)
    data = math.prod(shape[m] for m in plan.batch_axes)
    tp = math.prod(shape[m] for m in plan.activation_rules.get(ax.HEADS, ()))
    b = max(1, global_batch // data)
    T = seq_len // P
    tokens = b * T
    layout = layout_arrays(plan, n_devices, param_arrays(cfg, param_dtype, tie_embeddings=tie_embeddings))
    p = sum(r.bytes_per_device for r in layout)
    dev_tok, host_tok = saved_bytes_per_token_per_layer(cfg, policy, dtype)
    if not memory_kinds:  # XLA:CPU: offloaded residuals are ordinary temporaries
        dev_tok, host_tok = dev_tok + host_tok, 0
    acts = cfg.n_layers * tokens * dev_tok
    host = cfg.n_layers * tokens * host_tok
    opt = optimizer_states * p
    # offloaded parameters: copied in at the step's start and held until the update (read in
    # place from the pinned_host argument where memory kinds are stripped)
    params_dev = 0 if policy.offload_params and not memory_kinds else p
    opt_dev = 0 if policy.offload_optimizer else opt
    update = opt if policy.offload_optimizer and memory_kinds else 0
    host += (p if policy.offload_params else 0) + (opt if policy.offload_optimizer else 0)
    # the loss phase reads a copy of the head when its parameter is sharded (all-gathered) or cast
    head = next(r for r in layout if r.info.name == ("embed" if tie_embeddings else "head"))
    head_copy = head.bytes_per_device < head.global_bytes or _bytes(dtype) != _bytes(param_dtype)
    a = plan.attention
    U = shape.get(a.ulysses_axis, 1) if a.strategy == "usp" else 1
    # the attention call's residuals beyond the local q/k/v (gathered K/V, post-all-to-all k/v):
    # with remat: none every layer saves them; otherwise the replay rebuilds them for the block
    # being differentiated, live in both of its backward phases
    att_res = attention_kernel_residual_bytes(cfg, strategy=a.strategy, seq_len=seq_len, local_batch=b,
                                              context_degree=P, ulysses_degree=U, tensor_degree=tp, dtype=dtype)
    if policy.remat == "none":
        # saved by every layer; the block being differentiated copies its slices out of the stacks
        # (see layer_working_bytes_per_token), so they are ALSO live in both backward phases
        acts += cfg.n_layers * att_res
        if a.strategy in ("a2a", "usp") and _bytes(dtype) == 4:
            # Ulysses returns the output through an all-to-all: the float32 flash output is in
            # head layout, so the sequence-layout output ``wo`` reads is a second saved array
            # (in 16-bit it is the cast the ``none`` set already counts)
            acts += cfg.n_layers * tokens * cfg.n_heads // tp * cfg.head_dim * 4
    att = attention_working_bytes(
        cfg, strategy=a.strategy, kernel=a.kernel, seq_len=seq_len, local_batch=b, context_degree=P,
        ulysses_degree=U, tensor_degree=tp, block_q=a.block_q, block_kv=a.block_kv, block_q_dkv=a.block_q_dkv,
        block_kv_dkv=a.block_kv_dkv, dtype=dtype,
    )
    prologue = attention_prologue_bytes(cfg, strategy=a.strategy, kernel=a.kernel, seq_len=seq_len, local_batch=b,
                                        context_degree=P, ulysses_degree=U, tensor_degree=tp)
    att_fwd = attention_forward_bytes(
        cfg, strategy=a.strategy, kernel=a.kernel, seq_len=seq_len, local_batch=b, context_degree=P,
        ulysses_degree=U, tensor_degree=tp, block_q=a.block_q, block_kv=a.block_kv, dtype=dtype,
    )
    logits = logits_phase_bytes(cfg, tokens=tokens, vocab_tiling=policy.vocab_tiling, head_copy=head_copy, dtype=dtype,
                                xla_cpu=not memory_kinds)
    return MemoryBreakdown(
        params=params_dev,
        grads=p,
        optimizer=opt_dev,
        activations=acts,
        layer_working=tokens * layer_working_bytes_per_token(cfg, policy, dtype) + att_res + prologue,
        attention=tokens * attention_residual_bytes_per_token(cfg, policy, dtype) + att_res + att,
        logits=logits,
        host=host,
        attention_forward=att_fwd,
        update=update,
    )
