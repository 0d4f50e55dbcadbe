"""Model FLOPs per training step, counted as MaxText counts them.

Source: MaxText ``calculate_tflops_training_per_device`` (maxtext/MaxText/maxtext_utils.py):
matmul FLOPs are ``2 * tokens * (weights touched)``; attention is ``4 * B * S^2 * N * H`` per
layer (QK^T and PV), halved for a causal mask; training counts 3x the forward pass (forward,
and backward = 2x forward); recomputation (remat) is NOT counted. MFU computed from these is
*model* FLOPs utilisation.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol


class _ModelDims(Protocol):
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    mlp_dim: int
    vocab_size: int


@dataclasses.dataclass(frozen=True)
class StepFlops:
    """FLOPs of one training step for the whole global batch (not per device).

    Attributes:
      linear: matmul FLOPs of weights (q/k/v/o projections, SwiGLU MLP, output head), fwd+bwd.
      attention: QK^T and PV FLOPs (mask-aware, see :func:`visible_pairs`), fwd+bwd.
    """

    linear: float
    attention: float

    @property
    def total(self) -> float:
        return self.linear + self.attention


def visible_pairs(seq_len: int, *, causal: bool = True, window: int | None = None) -> int:
    """Number of (query, key) pairs a mask keeps in one sequence of ``seq_len`` tokens.

    Causal without window: S(S+1)/2, which MaxText approximates as S^2/2. A causal sliding
    window W keeps ``sum_i min(i + 1, W)``. Full attention keeps S^2 (with a window W,
    ``sum_i (min(i, W-1) + min(S-1-i, W-1) + 1)``).
    """
    S = seq_len
    if window is None or window >= S:
        return S * (S + 1) // 2 if causal else S * S
    W = window
    one_side = W * (W + 1) // 2 + (S - W) * W  # sum_i min(i+1, W)
    return one_side if causal else 2 * one_side - S


def training_flops(
    cfg: _ModelDims, seq_len: int, global_batch: int, *, causal: bool = True, window: int | None = None
) -> StepFlops:
    """Model FLOPs of one training step (forward + backward, 3x forward; MaxText convention).

    Attention counts ``4 * H * N * pairs`` per sequence and layer with ``pairs = S^2 / 2`` for a
    causal mask (MaxText halves; we use the same S^2/2, not S(S+1)/2, so MFU is comparable), and
    the exact pair count for a sliding window. Document masks are data-dependent and not credited
    (as in MaxText).

    Args:
      cfg: model dimensions (any object with the :class:`_ModelDims` attributes).
      seq_len: tokens per sequence S.
      global_batch: sequences per step B.

    Returns:
      :class:`StepFlops` in FLOPs for the whole step.
    """
    tokens = seq_len * global_batch
    D, N, K, H, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.mlp_dim
    per_layer_weights = D * (N + 2 * K) * H + N * H * D + 3 * D * F
    linear_fwd = 2 * tokens * (cfg.n_layers * per_layer_weights + D * cfg.vocab_size)
    if window is None or window >= seq_len:
        pairs = seq_len * seq_len / (2 if causal else 1)
    else:
        pairs = visible_pairs(seq_len, causal=causal, window=window)
    attn_fwd = 4 * global_batch * pairs * N * H * cfg.n_layers
    return StepFlops(linear=3.0 * linear_fwd, attention=3.0 * attn_fwd)
