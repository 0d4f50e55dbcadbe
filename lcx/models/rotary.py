"""Rotary position embeddings: frequency tables (plain, Llama 3.1, YaRN) and phases that stay
exact at millions of tokens.

Two separate precision problems meet at long context:

1. The *frequencies*. ``theta ** (-2i / H)`` rounded to float32 has a relative error of up to
   2^-24; multiplied by a position of 14,000,000 that is an error of up to ~0.4 rad in the phase
   of the fastest pair. Tables are therefore computed on the host in float64
   (:meth:`RopeConfig.frequencies`) and never rounded to float32 before the phase is formed.
2. The *phase* ``position * freq``. In float32 the product itself is rounded to 24 significant
   bits: at position 14,000,000 and ``freq = 1`` the spacing of float32 numbers is 1 rad, so
   neighbouring positions can get the same (or a wildly wrong) angle. :func:`rope_angles`
   instead reduces modulo one turn *exactly* before anything is rounded (below).

Exact range reduction (:func:`rope_angles`). Work in turns, ``t = freq / 2 pi`` per token. Split
the int32 position into four 8-bit digits, ``p = sum_k d_k 2^(8k)``. Then
``p t mod 1 = sum_k d_k c_k mod 1`` with ``c_k = (2^(8k) t) mod 1`` computed on the host in
float64 (exact: a power-of-two scaling and ``fmod``). Each ``c_k`` is split into a head with 16
fractional bits and a tail ``|tail| <= 2^-17``. ``d_k * head`` has at most 8 + 16 = 24 significant
bits, so it is exact in float32, and so is its fractional part, the sum of four of them and the
removal of the nearest whole turn. Only the tails' contribution (``< 2^-7`` turn) is rounded,
to ~2^-31 turn. The constants are computed in 50-digit decimal arithmetic from the exact float64
frequencies. Turning the phase into radians rounds twice (once with a fused multiply-add), so
the angle is within 2.4e-7 rad (two half-spacings of float32 near pi) of the exact
``p * freq mod 2 pi`` for every int32 position (tested against 50-digit values). Cost: about 25
elementwise float32 operations per (token, frequency), negligible next to attention.

Scaling methods (``RopeConfig.scaling_type``):

- ``None``: plain RoPE (Su et al., RoFormer, arXiv:2104.09864).
- ``"linear"``: position interpolation (Chen et al. 2023, arXiv:2306.15595; transformers'
  ``_compute_linear_scaling_rope_parameters``): every frequency divided by the factor (Gemma 3's
  global layers, factor 8).
- ``"ntk"``: NTK-aware scaling (bloc97, "NTK-Aware Scaled RoPE", 2023; YaRN paper,
  arXiv:2309.00071, section 3.1, eq. 16): plain RoPE with the base ``theta`` raised to
  ``theta * factor ** (H / (H - 2))``, which stretches the slowest pair's wavelength by exactly
  the factor and leaves the fastest pair unchanged (static: the factor does not follow the
  sequence, unlike transformers' ``dynamic`` rope type).
- ``"llama3"``: Llama 3.1 (Meta llama-models ``apply_scaling``; Hugging Face
  ``_compute_llama3_parameters``): wavelengths longer than ``original_max_len / low_freq_factor``
  are stretched by ``factor``, those shorter than ``original_max_len / high_freq_factor`` are
  kept, and the band between is interpolated linearly in ``original_max_len / wavelength``.
- ``"yarn"``: YaRN (Peng et al. 2023, arXiv:2309.00071, "NTK-by-parts" plus attention
  temperature), following Hugging Face transformers' ``_compute_yarn_parameters``: pair ``i``
  blends interpolated (``freq / factor``) and original frequencies with a linear ramp over pair
  indices between ``floor(low)`` and ``ceil(high)``, where ``low``/``high`` are the pair indices
  whose wavelength fits ``beta_fast``/``beta_slow`` rotations into ``original_max_len`` tokens.
  The attention factor (default ``0.1 ln(factor) + 1``, the paper's ``sqrt(1/t)``) multiplies
  cos and sin, i.e. BOTH the rotated queries and the rotated keys, exactly as transformers does:
  the logits ``q.k`` are therefore scaled by its square (``1/t`` in the paper's eq. 22).
"""

from __future__ import annotations

import dataclasses
import decimal
import math

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

ROPE_SCALING_TYPES: tuple[str | None, ...] = (None, "linear", "ntk", "llama3", "yarn")

_DIGIT_BITS = 8  # position digits: 4 x 8 bits cover every int32
_N_DIGITS = 4
_HEAD_BITS = 16  # fractional bits of each constant's head: 8 + 16 = 24 = float32 mantissa


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Everything that determines a RoPE frequency table and its attention factor.

    Built from a :class:`lcx.models.ModelConfig` by its ``rope`` property; hashable, so modules
    keep it as a static field.

    Attributes:
      head_dim: H, features per head (even); H/2 rotated pairs.
      theta: base wavelength.
      scaling_type: None, ``"linear"`` (position interpolation: every frequency divided by the
        factor), ``"ntk"`` (NTK-aware: a larger base), ``"llama3"`` or ``"yarn"`` (module docstring).
      factor: context stretch factor s (>= 1) for the scaled types; None for plain RoPE.
      original_max_len: tokens the unscaled model was trained at.
      low_freq_factor, high_freq_factor: Llama 3.1 band edges (Meta's defaults 1 and 4).
      beta_fast, beta_slow: YaRN ramp edges in rotations per ``original_max_len`` (32 and 1).
      attention_factor: YaRN's multiplier of cos and sin; None: ``0.1 ln(factor) + 1``.
    """

    head_dim: int
    theta: float
    scaling_type: str | None = None
    factor: float | None = None
    original_max_len: int = 8192
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None

    def __post_init__(self):
        if self.scaling_type not in ROPE_SCALING_TYPES:
            raise ValueError(f"rope scaling type {self.scaling_type!r} is unknown; choose one of {ROPE_SCALING_TYPES}")
        if self.scaling_type is not None and self.factor is None:
            raise ValueError(f"rope scaling type {self.scaling_type!r} needs a factor (rope_scaling_factor)")
        if self.scaling_type == "llama3" and not self.high_freq_factor > self.low_freq_factor > 0:
            raise ValueError(
                f"llama3 rope scaling needs high_freq_factor ({self.high_freq_factor}) > low_freq_factor "
                f"({self.low_freq_factor}) > 0"
            )
        if self.scaling_type == "yarn" and not self.beta_fast > self.beta_slow > 0:
            raise ValueError(f"yarn rope scaling needs beta_fast ({self.beta_fast}) > beta_slow ({self.beta_slow}) > 0")

    @property
    def base(self) -> float:
        """The base of the frequency table: ``theta``, or NTK-aware's ``theta * factor ** (H / (H - 2))``."""
        if self.scaling_type != "ntk":
            return float(self.theta)
        assert self.factor is not None  # __post_init__: a scaling type needs a factor
        return float(self.theta) * float(self.factor) ** (self.head_dim / (self.head_dim - 2))

    def frequencies(self) -> np.ndarray:
        """Angular frequencies in radians per token, float64 NumPy ``[H/2]`` (host constants)."""
        H = self.head_dim
        freq = self.base ** (-np.arange(0, H, 2, dtype=np.float64) / H)
        if self.scaling_type in (None, "ntk"):
            return freq
        assert self.factor is not None  # __post_init__: a scaling type needs a factor
        s = float(self.factor)
        L = float(self.original_max_len)
        if self.scaling_type == "linear":
            # position interpolation (Chen et al. 2023, arXiv:2306.15595): every frequency / s;
            # transformers' "linear" rope_type (Gemma 3's global layers, factor 8)
            return freq / s
        if self.scaling_type == "llama3":
            ratio = L * freq / (2 * math.pi)  # = original_max_len / wavelength
            lo, hi = float(self.low_freq_factor), float(self.high_freq_factor)
            smooth = np.clip((ratio - lo) / (hi - lo), 0.0, 1.0)
            return (1.0 - smooth) * freq / s + smooth * freq

        # yarn: transformers' find_correction_range with truncate=True (its default)
        def dim(rotations: float) -> float:
            return H * math.log(L / (rotations * 2 * math.pi)) / (2 * math.log(self.theta))

        low = max(math.floor(dim(self.beta_fast)), 0)
        high = min(math.ceil(dim(self.beta_slow)), H - 1)
        if low == high:
            high += 0.001  # transformers' guard against a zero-width ramp
        ramp = np.clip((np.arange(H // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
        extrapolate = 1.0 - ramp  # 1: keep the original frequency (fast pairs), 0: interpolate
        return freq / s * (1.0 - extrapolate) + freq * extrapolate

    @property
    def attention_scaling(self) -> float:
        """Multiplier of cos and sin (so of q and of k): YaRN's attention factor, else 1."""
        if self.scaling_type != "yarn":
            return 1.0
        if self.attention_factor is not None:
            return float(self.attention_factor)
        assert self.factor is not None  # __post_init__: a scaling type needs a factor
        return yarn_mscale(float(self.factor))


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's ``sqrt(1/t) = 0.1 mscale ln(s) + 1`` (arXiv:2309.00071 eq. 22; 1 for ``s <= 1``)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_frequencies(
    head_dim: int,
    *,
    theta: float,
    scaling_factor: float | None = None,
    original_max_len: int = 8192,
    scaling_type: str | None = None,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> Float[np.ndarray, " half"]:
    """RoPE angular frequencies ``theta ** (-2i / H)`` in radians per token, float64 NumPy.

    A ``scaling_factor`` without ``scaling_type`` means Llama 3.1 scaling (``"llama3"``), the
    only kind lcx had before YaRN. See :class:`RopeConfig` and the module docstring.

    Returns:
      float64 ``[H/2]`` host array; pass it to :func:`rope` as is (rounding it to float32 would
      cost up to ~0.4 rad of phase at 14M tokens).
    """
    if scaling_type is None and scaling_factor is not None:
        scaling_type = "llama3"
    return RopeConfig(
        head_dim=head_dim,
        theta=float(theta),
        scaling_type=scaling_type,
        factor=scaling_factor,
        original_max_len=original_max_len,
        low_freq_factor=low_freq_factor,
        high_freq_factor=high_freq_factor,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
    ).frequencies()


# 2 pi to 60 digits, for the reduction constants (decimal arithmetic, on the host, once per trace)
_TWO_PI = decimal.Decimal("6.28318530717958647692528676655900576839433879875021164194988918")
# 2 pi as float32 head + tail: the final turns -> radians product without the 2.8e-8 relative
# error of float32(2 pi)
_TWO_PI_HI = np.float32(2 * math.pi)
_TWO_PI_LO = np.float32(2 * math.pi - float(_TWO_PI_HI))


def _phase_constants(freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Heads and tails ``[4, H/2]`` float32 of ``c_k = (2^(8k) freq / 2 pi) mod 1``.

    Computed in 50-digit decimal arithmetic from the exact binary value of each float64
    frequency, so the constants carry no error of their own (a float64 ``freq / 2 pi`` would be
    off by ~1e-17 turn, 2e-7 rad once multiplied by a position near 2^31).
    """
    c = np.empty((_N_DIGITS, len(freq)), np.float64)
    with decimal.localcontext() as ctx:
        ctx.prec = 50
        for i, f in enumerate(np.asarray(freq, np.float64)):
            turns = decimal.Decimal(float(f)) / _TWO_PI
            for k in range(_N_DIGITS):
                c[k, i] = float((turns * (1 << (_DIGIT_BITS * k))) % 1)
    head = np.round(c * 2.0**_HEAD_BITS) / 2.0**_HEAD_BITS  # exactly representable in float32
    return head.astype(np.float32), (c - head).astype(np.float32)


def rope_angles(positions: Int[Array, "*b"], freq: Float[np.ndarray, " half"]) -> Float[Array, "*b half"]:
    """``positions * freq`` reduced to about ``[-pi, pi]`` radians, float32, within 2.4e-7 rad.

    Args:
      positions: int32 token positions, any shape, ``|p| < 2^31``.
      freq: float64 host frequencies ``[H/2]`` in radians per token (:func:`rope_frequencies`).

    Returns:
      float32 angles ``[*positions.shape, H/2]`` in radians, congruent to the exact product of
      the position and the float64 frequency modulo ``2 pi`` within 2.4e-7 rad (module
      docstring; tested up to 2^31 - 1).
    """
    head, tail = _phase_constants(freq)
    p = positions.astype(jnp.int32)
    a = jnp.abs(p)  # the digits of |p|; the phase of -p is minus that of p
    whole = jnp.zeros(p.shape + (head.shape[1],), jnp.float32)
    part = jnp.zeros_like(whole)
    for k in range(_N_DIGITS):
        d = ((a >> (_DIGIT_BITS * k)) & (2**_DIGIT_BITS - 1)).astype(jnp.float32)[..., None]
        exact = d * head[k]  # <= 24 significant bits: no rounding
        whole = whole + (exact - jnp.floor(exact))  # sum of multiples of 2^-16 below 4: exact
        part = part + d * tail[k]  # |part| < 2^-7 turn; the only rounded terms
    # Nearest whole turn of the phase removed: exact (whole is a multiple of 2^-16 below 4), and
    # whole + part is never rounded into one float32, whose spacing near 1/2 turn is 1.9e-7 rad.
    whole = whole - jnp.round(whole + part)
    neg = (p < 0)[..., None]
    whole, part = jnp.where(neg, -whole, whole), jnp.where(neg, -part, part)
    # two roundings in all (<= 1.2e-7 rad each near pi): the product and the sum
    return whole * _TWO_PI_HI + (whole * _TWO_PI_LO + part * _TWO_PI_HI)


def rope(
    x: Float[Array, "B T N H"],
    positions: Int[Array, "B T"],
    freq: Float[np.ndarray, " H//2"] | Float[Array, " H//2"],
    *,
    scale: float = 1.0,
) -> Float[Array, "B T N H"]:
    """Rotary position embedding (Su et al., RoFormer, arXiv:2104.09864).

    Pairs feature ``i`` with ``i + H/2`` (the "rotate half" layout of Llama's Hugging Face and
    MaxText ports; equivalent to interleaved pairs up to a fixed permutation of the weights) and
    rotates each pair by ``positions * freq[i]`` radians, then multiplies by ``scale`` (YaRN's
    attention factor; 1 otherwise).

    Args:
      x: queries or keys ``[B, T, N, H]``, any float dtype; H even.
      positions: int32 ``[B, T]`` global token positions (arbitrary: restarting per document,
        permuted by the layout).
      freq: angular frequencies in radians per token ``[H/2]``. A NumPy array (float64 from
        :func:`rope_frequencies`) takes the exact path (:func:`rope_angles`), right at any int32
        position. A JAX array (e.g. traced) falls back to the float32 product
        ``positions * freq``, whose error grows like ``position * 6e-8`` rad.
      scale: multiplier of the rotated vector (cos and sin).

    Returns:
      ``[B, T, N, H]`` in ``x.dtype``; rotation in float32.
    """
    if isinstance(freq, np.ndarray):
        angle = rope_angles(positions, freq)[..., None, :]  # [B, T, 1, H/2] radians
    else:
        angle = positions.astype(jnp.float32)[..., None, None] * freq.astype(jnp.float32)
    return _rotate(x, jnp.cos(angle), jnp.sin(angle), scale)


def _rotate(x: Array, cos: Array, sin: Array, scale: float) -> Array:
    if scale != 1.0:
        cos, sin = cos * jnp.float32(scale), sin * jnp.float32(scale)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def rope_cos_sin(
    positions: Int[Array, "B T"], rc: RopeConfig
) -> tuple[Float[Array, "B T 1 half"], Float[Array, "B T 1 half"]]:
    """cos and sin ``[B, T, 1, H/2]`` float32 of the exact phases, times the attention factor:
    computed once per layer and shared by queries and keys (:func:`apply_rope`)."""
    angle = rope_angles(positions, rc.frequencies())[..., None, :]
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    if rc.attention_scaling != 1.0:
        cos, sin = cos * jnp.float32(rc.attention_scaling), sin * jnp.float32(rc.attention_scaling)
    return cos, sin


def apply_rope(x: Float[Array, "B T N H"], cos: Array, sin: Array) -> Float[Array, "B T N H"]:
    """Rotate ``x`` by precomputed :func:`rope_cos_sin` (already scaled)."""
    return _rotate(x, cos, sin, 1.0)


__all__ = [
    "ROPE_SCALING_TYPES",
    "RopeConfig",
    "apply_rope",
    "rope",
    "rope_angles",
    "rope_cos_sin",
    "rope_frequencies",
    "yarn_mscale",
]
