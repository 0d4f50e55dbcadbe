"""RoPE: frequency tables (plain, Llama 3.1, YaRN) against float64 tables written from the
sources; phases exact at long positions (257, 1,000,003, 14,000,000, 2^31 - 1) against float64;
YaRN's attention factor on q.k; config fields and their checks."""

from __future__ import annotations

import decimal
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from beartype import beartype
from jaxtyping import jaxtyped

import lcx.models as lm
from lcx.models.rotary import RopeConfig, rope_angles

check = jaxtyped(typechecker=beartype)


# ------------------------------------------------------------------ float64 reference tables
def llama3_table(H, theta, factor, old_len, low=1.0, high=4.0):
    """Meta llama-models ``apply_scaling``, written out in float64 Python."""
    out = []
    for i in range(H // 2):
        f = theta ** (-2.0 * i / H)
        wavelen = 2 * math.pi / f
        if wavelen < old_len / high:
            out.append(f)
        elif wavelen > old_len / low:
            out.append(f / factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return np.array(out)


def yarn_table(H, theta, factor, old_len, beta_fast=32.0, beta_slow=1.0):
    """YaRN NTK-by-parts (arXiv:2309.00071 eq. 18-20; transformers' truncated ramp), float64.

    A pair whose wavelength fits more than beta_fast rotations into the original context keeps
    its frequency; fewer than beta_slow rotations: divided by the factor; linear in the pair
    index between (the index bounds rounded outward, as transformers does).
    """

    def pair_index(rotations):  # i such that old_len / wavelength_i == rotations
        return H * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = max(math.floor(pair_index(beta_fast)), 0), min(math.ceil(pair_index(beta_slow)), H - 1)
    out = []
    for i in range(H // 2):
        f = theta ** (-2.0 * i / H)
        keep = 1.0 - min(max((i - lo) / (hi - lo), 0.0), 1.0)
        out.append(f * keep + f / factor * (1 - keep))
    return np.array(out)


@pytest.mark.parametrize(
    "H, theta, factor, old_len",
    [(128, 500_000.0, 8.0, 8192), (256, 500_000.0, 8.0, 8192), (16, 10_000.0, 32.0, 64), (64, 10_000.0, 4.0, 4096)],
)
def test_frequency_tables_match_float64_references(H, theta, factor, old_len):
    plain = check(lm.rope_frequencies)(H, theta=theta)
    assert plain.dtype == np.float64
    np.testing.assert_allclose(plain, theta ** (-np.arange(0, H, 2) / H), rtol=1e-15)
    l3 = check(lm.rope_frequencies)(H, theta=theta, scaling_factor=factor, original_max_len=old_len)
    np.testing.assert_allclose(l3, llama3_table(H, theta, factor, old_len), rtol=1e-14)
    y = lm.rope_frequencies(H, theta=theta, scaling_factor=factor, original_max_len=old_len, scaling_type="yarn")
    np.testing.assert_allclose(y, yarn_table(H, theta, factor, old_len), rtol=1e-14)
    # the three regimes all occur: kept, interpolated, stretched
    assert y[0] == plain[0] and y[-1] == pytest.approx(plain[-1] / factor, rel=1e-14)


def test_yarn_ramp_of_a_128k_model():
    """Qwen2.5-style YaRN (H 128, theta 1e6, factor 4, 32K): pairs 0..ceil edges by hand."""
    rc = RopeConfig(head_dim=128, theta=1e6, scaling_type="yarn", factor=4.0, original_max_len=32768)
    lo = 128 * math.log(32768 / (32 * 2 * math.pi)) / (2 * math.log(1e6))  # 23.6 -> 23
    hi = 128 * math.log(32768 / (1 * 2 * math.pi)) / (2 * math.log(1e6))  # 39.6 -> 40
    assert (math.floor(lo), math.ceil(hi)) == (23, 40)
    f, base = rc.frequencies(), 1e6 ** (-np.arange(0, 128, 2) / 128)
    np.testing.assert_array_equal(f[:24], base[:24])
    np.testing.assert_allclose(f[40:], base[40:] / 4, rtol=1e-15)
    np.testing.assert_allclose(f[31], base[31] * (9 / 17) + base[31] / 4 * (8 / 17), rtol=1e-15)
    assert rc.attention_scaling == pytest.approx(0.1 * math.log(4) + 1)  # 1.1386
    assert (
        RopeConfig(head_dim=8, theta=1e4, scaling_type="yarn", factor=4.0, attention_factor=1.0).attention_scaling == 1
    )
    assert RopeConfig(head_dim=8, theta=1e4, scaling_type="llama3", factor=8.0).attention_scaling == 1


POSITIONS = [
    0,
    1,
    255,
    256,
    257,
    4095,
    65_537,
    1_000_003,
    8_388_609,
    14_000_000,
    14_000_001,
    16_777_217,
    2**31 - 2,
    2**31 - 1,
    -1,
    -257,
]


def wrapped_error(angle32, angle64):
    d = np.asarray(angle32, np.float64) - angle64
    return np.abs((d + np.pi) % (2 * np.pi) - np.pi)


def exact_phase(positions, freq):
    """``p * f mod 2 pi`` of the exact binary float64 ``f``, in 50-digit decimal arithmetic (a
    float64 product is itself off by up to 2.4e-7 rad near p = 2^31)."""
    with decimal.localcontext() as ctx:
        ctx.prec = 50
        two_pi = decimal.Decimal("6.28318530717958647692528676655900576839433879875021164194988918")
        return np.array(
            [[float(decimal.Decimal(int(p)) * decimal.Decimal(float(f)) % two_pi) for f in freq] for p in positions]
        )


@pytest.mark.parametrize("scaling", [None, "llama3", "yarn"])
def test_phases_are_exact_at_long_positions(scaling):
    """Angle ``p * f mod 2 pi`` within 2.5e-7 rad of the exact value for every pair, up to 2^31 - 1.

    The bound: the reduced phase is formed without rounding except for the tails (< 1e-8 rad);
    turning it into radians rounds twice (a product and a sum), each by at most half a float32
    spacing near pi (1.19e-7 rad); with a fused multiply-add (XLA under jit) once. The float32
    product ``p * f`` misses by up to ~0.5 rad at 14M tokens (checked below).
    """
    freq = lm.rope_frequencies(
        128,
        theta=500_000.0,
        scaling_factor=None if scaling is None else 8.0,
        original_max_len=8192,
        scaling_type=scaling,
    )
    rng = np.random.default_rng(0)
    pos = np.concatenate([POSITIONS, rng.integers(-(2**31) + 1, 2**31, 48)])
    ref = exact_phase(pos, freq)
    angles = check(rope_angles)
    for got in (
        angles(jnp.asarray(pos, jnp.int32), freq),
        jax.jit(lambda p: angles(p, freq))(jnp.asarray(pos, jnp.int32)),
    ):
        assert got.dtype == jnp.float32 and got.shape == (len(pos), 64)
        err = wrapped_error(got, ref)
        assert err.max() < 2.5e-7, (err.max(), pos[err.max(1).argmax()])
        assert np.all(np.abs(np.asarray(got)) <= np.pi + 1e-6)
    # neighbours differ by exactly one step of each frequency
    for p in (256, 1_000_003, 14_000_000, 2**31 - 2):
        a = angles(jnp.asarray([p, p + 1], jnp.int32), freq)
        np.testing.assert_array_less(wrapped_error(np.asarray(a[1]) - np.asarray(a[0]), freq), 5e-7)
    naive = jnp.asarray(pos, jnp.int32).astype(jnp.float32)[:, None] * jnp.asarray(freq, jnp.float32)
    assert wrapped_error(naive, ref)[pos == 14_000_000].max() > 0.1  # why the reduction exists


def test_rope_rotation_matches_float64_and_bf16_positions_stay_distinct():
    """rope() of bf16 queries at 256 vs 257 and at 14M vs 14M + 1: float64 rotation, bf16 rounding."""
    H = 64
    freq = lm.rope_frequencies(H, theta=500_000.0, scaling_factor=8.0)
    x = jax.random.normal(jax.random.key(0), (1, 4, 2, H), jnp.float32)
    pos = np.array([[256, 257, 14_000_000, 14_000_001]], np.int32)
    ang = pos[..., None, None].astype(np.float64) * freq  # [1, 4, 1, H/2]
    x64 = np.asarray(x, np.float64)
    z = (x64[..., : H // 2] + 1j * x64[..., H // 2 :]) * np.exp(1j * ang)
    ref = np.concatenate([z.real, z.imag], -1)
    out = check(lm.rope)(x, jnp.asarray(pos), freq)
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-6)  # |x| < 5: a few float32 spacings
    xb = x.astype(jnp.bfloat16)
    outb = check(lm.rope)(xb, jnp.asarray(pos), freq)
    assert outb.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(outb, np.float32), ref, rtol=2**-7, atol=2**-7)
    assert not np.array_equal(np.asarray(outb[0, 0], np.float32), np.asarray(outb[0, 1], np.float32))
    assert not np.array_equal(np.asarray(outb[0, 2], np.float32), np.asarray(outb[0, 3], np.float32))


def test_yarn_scales_attention_logits_by_the_factor_squared():
    """transformers multiplies cos and sin (q and k) by 0.1 ln(s) + 1: q.k scales by its square."""
    cfg = lm.ModelConfig(head_dim=16, rope_scaling_type="yarn", rope_scaling_factor=4.0, rope_original_max_len=64)
    rc = cfg.rope
    q, k = jax.random.normal(jax.random.key(1), (2, 1, 1, 1, 16))
    pq, pk = jnp.array([[30]], jnp.int32), jnp.array([[7]], jnp.int32)
    scaled = jnp.sum(
        lm.rope(q, pq, rc.frequencies(), scale=rc.attention_scaling)
        * lm.rope(k, pk, rc.frequencies(), scale=rc.attention_scaling)
    )
    plain = jnp.sum(lm.rope(q, pq, rc.frequencies()) * lm.rope(k, pk, rc.frequencies()))
    np.testing.assert_allclose(scaled, plain * (0.1 * math.log(4) + 1) ** 2, rtol=1e-5)


def test_config_fields_and_checks():
    c = lm.ModelConfig(rope_scaling_factor=8.0)
    assert c.rope_scaling_type == "llama3"  # a factor alone means Llama 3.1 scaling, as before
    assert lm.preset("llama3_1_8b").rope == RopeConfig(
        head_dim=128, theta=500_000.0, scaling_type="llama3", factor=8.0, original_max_len=8192
    )
    assert lm.preset("llama3_70b").rope.scaling_type is None
    with pytest.raises(ValueError, match="rope_scaling_type='yarn' needs model.rope_scaling_factor"):
        lm.ModelConfig(rope_scaling_type="yarn")
    with pytest.raises(ValueError, match="'dynamic' is unknown"):
        lm.ModelConfig(rope_scaling_type="dynamic", rope_scaling_factor=2.0)
    with pytest.raises(ValueError, match="high_freq_factor"):
        lm.ModelConfig(rope_scaling_factor=8.0, rope_low_freq_factor=4.0, rope_high_freq_factor=1.0)
    with pytest.raises(ValueError, match="beta_fast"):
        lm.ModelConfig(rope_scaling_type="yarn", rope_scaling_factor=2.0, rope_beta_fast=0.5)
