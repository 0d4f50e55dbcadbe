"""FLOPs of a training step, counted from the real layer shapes, as MaxText counts them.

Source of the convention: MaxText ``calculate_tflops_training_per_device``
(github.com/AI-Hypercomputer/maxtext, ``maxtext_utils.py``):

- every weight matmul costs ``2 * tokens * weights`` FLOPs (one multiply and one add per weight
  and token): q/k/v projections ``D (N + 2K) H`` (GQA: K kv heads), output projection ``N H D``,
  SwiGLU ``3 D F`` (gate, up, down), and the output head ``D V`` (the input embedding is a gather
  and costs nothing);
- attention costs ``4 * B * S^2 * N * H`` per layer (``Q K^T`` and ``P V``, 2 FLOPs each), halved
  for a causal mask (MaxText uses ``S^2 / 2``, not ``S (S + 1) / 2``);
- training is 3x the forward pass (backward = 2x forward); rematerialisation is NOT counted.

MFU computed from these numbers is *model* FLOPs utilisation; the recomputation a remat policy
adds is reported separately (:func:`recompute_flops`) and enters the step-time estimate, not the
MFU numerator. With these counts the published MaxText step times reproduce the published MFU to
the last digit (tests/test_cost.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Final, Protocol, TypedDict, Unpack, runtime_checkable

from lcx.cost.kinds import LayerGroup, layer_groups


@runtime_checkable
class ModelDims(Protocol):
    """The model sizes the ledger reads (``lcx.models.ModelConfig`` has them all)."""

    # Final: read-only members, so a frozen config (a frozen dataclass's fields) satisfies it
    d_model: Final[int]
    n_layers: Final[int]
    n_heads: Final[int]
    n_kv_heads: Final[int]
    head_dim: Final[int]
    mlp_dim: Final[int]
    vocab_size: Final[int]


@dataclasses.dataclass(frozen=True)
class StepFlops:
    """Model FLOPs of one training step for the whole global batch (not per device).

    Attributes:
      linear: weight-matmul FLOPs (q/k/v/o projections, SwiGLU MLP, output head), fwd + bwd.
      attention: ``Q K^T`` and ``P V`` FLOPs (mask-aware, see :func:`attention_pairs`), fwd + bwd.
    """

    linear: float
    attention: float

    @property
    def total(self) -> float:
        """Model FLOPs per step (the MFU numerator)."""
        return self.linear + self.attention

    @property
    def attention_fraction(self) -> float:
        """Share of attention in the model FLOPs (>= 95% at >= 1M tokens for the 8B models)."""
        return self.attention / self.total if self.total else 0.0


def linear_weights_per_token(cfg: ModelDims) -> int:
    """Weights every token multiplies through in one forward pass: ``L * (D (N + 2K) H + N H D +
    3 D F) + D V`` (blocks, then the output head). Norm gains are elementwise and not counted."""
    D, N, K, H, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.mlp_dim
    return cfg.n_layers * (D * (N + 2 * K) * H + N * H * D + 3 * D * F) + D * cfg.vocab_size


def visible_pairs(seq_len: int, *, causal: bool = True, window: int | None = None, chunk: int | None = None) -> int:
    """Exact number of (query, key) pairs a mask keeps in one sequence of ``seq_len`` tokens.

    Causal: ``S (S + 1) / 2``. A causal sliding window W (``q - k < W``) keeps ``sum_i min(i + 1,
    W)``; a bidirectional window keeps ``|q - k| < W``. Chunked attention (aligned chunks of C
    tokens, ``q // C == k // C``) keeps ``C (C + 1) / 2`` per whole chunk causal (``C^2``
    bidirectional) and the same of the last, partial chunk. Pure integer arithmetic, O(1).
    """
    S = seq_len
    if chunk is not None:
        n, r = divmod(S, chunk)
        return sum((m * (m + 1) // 2 if causal else m * m) * count for m, count in ((chunk, n), (r, 1)))
    if window is None or window >= S:
        return S * (S + 1) // 2 if causal else S * S
    W = window
    one_side = W * (W + 1) // 2 + (S - W) * W  # sum_i min(i + 1, W)
    return one_side if causal else 2 * one_side - S


def attention_pairs(
    seq_len: int,
    *,
    causal: bool = True,
    window: int | None = None,
    chunk: int | None = None,
    documents: Sequence[int] | None = None,
) -> float:
    """(query, key) pairs per sequence that the attention FLOP count credits.

    Without a window or chunks (a global layer) this is MaxText's count (``S^2 / 2`` causal,
    ``S^2`` full), so MFU is comparable with MaxText's. A sliding window or chunks (of at most S
    tokens) use the exact count of :func:`visible_pairs`. With ``documents`` (lengths of the packed documents in tokens, summing
    to ``seq_len``) a document mask is credited per document: ``sum_d pairs(len_d)`` with the
    same rules, since no pair crosses a document boundary.

    Raises:
      ValueError: document lengths that do not sum to ``seq_len`` or are not positive.
    """
    if documents is not None:
        docs = [int(d) for d in documents]
        if any(d < 1 for d in docs) or sum(docs) != seq_len:
            raise ValueError(f"document lengths {docs[:8]}... must be positive and sum to seq_len={seq_len}")
        return sum(attention_pairs(d, causal=causal, window=window, chunk=chunk) for d in docs)
    if (window is None or window >= seq_len) and (chunk is None or chunk >= seq_len):
        return seq_len * seq_len / (2 if causal else 1)
    return float(visible_pairs(seq_len, causal=causal, window=window, chunk=chunk))


class MaskArgs(TypedDict, total=False):
    """The mask keywords of the FLOP counts (PEP 692 ``**mask``), as :func:`attention_pairs`
    takes them and with its defaults.

    Keys:
      causal: causal mask (halves the attention count; default True).
      window: sliding window in tokens, or None (default).
      chunk: attention chunk in tokens (chunked attention), or None (default).
      documents: packed document lengths (document mask), or None (default).
    """

    causal: bool
    window: int | None
    chunk: int | None
    documents: Sequence[int] | None


def forward_flops(cfg: ModelDims, seq_len: int, batch: int, **mask: Unpack[MaskArgs]) -> StepFlops:
    """Model FLOPs of ONE forward pass over ``batch`` sequences of ``seq_len`` tokens under the
    mask ``**mask`` (:class:`MaskArgs`).

    A model of several layer kinds (``layer_kinds``: :func:`~lcx.cost.kinds.layer_groups`)
    counts each kind's pairs over its layers; ``window`` / ``chunk`` then must be None or the
    kinds' own.

    Returns:
      :class:`StepFlops` (linear ``2 * tokens * weights``; attention ``4 * pairs * N * H * L``
      per sequence, summed over the layer kinds: :func:`kind_attention_flops`).
    """
    tokens = seq_len * batch
    linear = 2.0 * tokens * linear_weights_per_token(cfg)
    groups = layer_groups(cfg, window=mask.get("window"), chunk=mask.get("chunk"))
    attention = sum(kind_attention_flops(cfg, seq_len, batch, g, **mask) for g in groups)
    return StepFlops(linear=linear, attention=attention)


def kind_attention_flops(
    cfg: ModelDims, seq_len: int, batch: int, group: LayerGroup, **mask: Unpack[MaskArgs]
) -> float:
    """Attention FLOPs of ONE forward pass through the layers of ``group`` (one kind), over
    ``batch`` sequences of ``seq_len`` tokens: ``4 * batch * pairs * N * H * layers``, the pairs
    those of the group's mask (its window or chunk; ``causal`` and ``documents`` from ``mask``)."""
    causal, documents = mask.get("causal", True), mask.get("documents")
    pairs = attention_pairs(
        seq_len, causal=causal, window=group.mask.window, chunk=group.mask.chunk, documents=documents
    )
    return 4.0 * batch * pairs * cfg.n_heads * cfg.head_dim * group.layers


def training_flops(cfg: ModelDims, seq_len: int, global_batch: int, **mask: Unpack[MaskArgs]) -> StepFlops:
    """Model FLOPs of one training step: 3x :func:`forward_flops` (MaxText convention).

    Args:
      cfg: model dimensions (any object with the :class:`ModelDims` attributes).
      seq_len: tokens per sequence S.
      global_batch: sequences per step B.
      **mask: ``causal``, ``window``, ``documents`` (:class:`MaskArgs`).

    Returns:
      :class:`StepFlops` in FLOPs for the whole step (divide by the device count for MaxText's
      per-device TFLOPs).
    """
    f = forward_flops(cfg, seq_len, global_batch, **mask)
    return StepFlops(linear=3.0 * f.linear, attention=3.0 * f.attention)


RECOMPUTED_FORWARD_FRACTION: dict[str, tuple[float, float]] = {
    "none": (0.0, 0.0),
    "full": (1.0, 1.0),
    "dots_with_no_batch_dims_saveable": (0.0, 1.0),
    "dots_saveable": (0.0, 0.0),
    "custom": (1.0, 1.0),
}
"""Remat policy -> (fraction of the linear forward, fraction of the attention forward) that the
backward pass recomputes. ``full`` replays the whole block; ``dots_with_no_batch_dims_saveable``
keeps the projection outputs but replays attention (its einsums have batch dimensions);
``dots_saveable`` keeps every matmul output. MaxText's ``custom`` policy with the attention
context kept (``context=device|offload``) recomputes the projections but not the attention
kernel; with ``context=remat`` it replays attention too (see :mod:`lcx.cost.memory`)."""


def recompute_flops(
    cfg: ModelDims,
    seq_len: int,
    global_batch: int,
    remat: str,
    *,
    keep_context: bool = False,
    vocab_tiling: int = 1,
    **mask: Unpack[MaskArgs],
) -> float:
    """FLOPs the backward pass spends recomputing the forward under a remat policy (per step).

    Not model FLOPs: MaxText's MFU ignores them; they lengthen the step.

    The blocks' replay is the policy's fraction of their forward (the output head is outside
    the scanned blocks, so no remat policy replays it). With vocabulary tiling (``vocab_tiling >
    1``) the backward replays each tile's logits: ``lcx.training.loss.
    vocab_tiled_loss_sum_and_count`` checkpoints its scan body with nothing saved, so the head
    matmul ``h [B, S, D] @ head [D, V]`` runs once more, :func:`head_replay_flops` (``2 S B D
    V``); the softmax and loss around it are elementwise and not counted, as MaxText counts
    none. Untiled (1), the loss keeps its logits and replays nothing.

    Args:
      remat: a key of :data:`RECOMPUTED_FORWARD_FRACTION`.
      keep_context: ``custom`` policy only: the attention output is saved (``context=device`` or
        ``offload``), so the attention kernel is not replayed.
      vocab_tiling: tiles of the output head and loss (``memory.vocab_tiling``; 1: untiled).
      **mask: the attention mask (:class:`MaskArgs`).

    Raises:
      ValueError: unknown policy, or ``vocab_tiling`` < 1.
    """
    if remat not in RECOMPUTED_FORWARD_FRACTION:
        raise ValueError(f"unknown remat policy {remat!r}; choose one of {sorted(RECOMPUTED_FORWARD_FRACTION)}")
    lin, att = RECOMPUTED_FORWARD_FRACTION[remat]
    if remat == "custom" and keep_context:
        att = 0.0
    f = forward_flops(cfg, seq_len, global_batch, **mask)
    head = 2.0 * seq_len * global_batch * cfg.d_model * cfg.vocab_size  # the head is outside the scanned blocks
    return lin * (f.linear - head) + att * f.attention + head_replay_flops(cfg, seq_len, global_batch, vocab_tiling)


def head_replay_flops(cfg: ModelDims, seq_len: int, global_batch: int, vocab_tiling: int = 1) -> float:
    """FLOPs of the output head's replay under vocabulary tiling (whole batch, per step):
    ``2 S B D V`` when ``vocab_tiling > 1`` (each tile's logits are recomputed in the backward,
    see :func:`recompute_flops`), 0 untiled. Linear recompute, not model FLOPs.

    Raises:
      ValueError: ``vocab_tiling`` < 1.
    """
    if vocab_tiling < 1:
        raise ValueError(f"vocab_tiling must be >= 1, got {vocab_tiling}")
    return 2.0 * seq_len * global_batch * cfg.d_model * cfg.vocab_size if vocab_tiling > 1 else 0.0


def prefill_flops_per_layer(
    d_model: int, params_per_layer: int, n_tokens: int, *, causal: bool = True
) -> tuple[float, float]:
    """Forward FLOPs of one block on ``n_tokens`` tokens: (linear, quadratic).

    Linear ``2 n P_layer`` (``25.5 n d^2`` for Llama 3 70B, whose ``P_layer = 12.75 d^2``);
    quadratic ``4 n^2 d``, halved for causal (``2 n^2 d``), with ``d = N H`` the attention width.
    Source: counting the matmuls of one layer (Kaplan et al. 2020, arXiv:2001.08361, table 1,
    with the attention term kept).
    """
    lin = 2.0 * n_tokens * params_per_layer
    quad = 4.0 * n_tokens * n_tokens * d_model / (2 if causal else 1)
    return lin, quad


def crossover_tokens(d_model: int, params_per_layer: int, *, causal: bool = True) -> float:
    """Sequence length where attention FLOPs equal the linear FLOPs of a block, in tokens:
    ``2 n P = 2 n^2 d`` gives ``n = P / d`` (causal) — ``12.75 d = 104,448`` for Llama 3 70B."""
    return params_per_layer / d_model * (1 if causal else 0.5)
