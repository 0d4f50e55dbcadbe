"""remat=custom: per-tensor placements (device / host offload / recompute) of the block input,
q/k/v and the flash residuals; same loss and gradients as no remat on 1 and 8 devices; the
offload reaches the lowered program; the cost ledger counts exactly the saved residuals."""

from __future__ import annotations

import contextlib
import io
import math
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _compile_cache import compile_cache
from jax.ad_checkpoint import print_saved_residuals

import lcx.cost as cost
import lcx.models as lm
from lcx.sharding import AttentionConfig, Plan, bind, layout_permutation

CFG = lm.ModelConfig(
    name="test", vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64
)
OFFLOAD = dict(remat="custom", remat_layer_input="offload", remat_qkv="offload", remat_context="offload")
DEVICE = dict(remat="custom", remat_layer_input="device", remat_qkv="device", remat_context="device")
POLICIES = [
    dict(remat="custom", remat_layer_input="offload", remat_context="offload"),  # MaxText's long-context recipe
    DEVICE,
    OFFLOAD,
]


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    """The remat-none references below repeat each other's programs: compile each once."""
    with compile_cache(tmp_path_factory.mktemp("xla_cache")):
        yield


@pytest.fixture(scope="module")
def one_device():
    return bind(Plan(mesh=(("data", -1),), activations={"batch": "data"}), jax.devices()[:1])


@pytest.fixture(scope="module")
def ring(devices):
    plan = Plan(
        mesh=(("data", 2), ("context", 4)),
        activations={"batch": "data", "seq": ("context",)},
        attention=AttentionConfig(strategy="ring", layout="zigzag", block_q=2, block_kv=2),
    )
    plan.validate(8, dims=CFG.dims(), seq_len=16, global_batch=2)
    return bind(plan, devices)


def _batch(B: int, T: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    tok = jnp.asarray(rng.integers(0, CFG.vocab_size, (B, T)).astype(np.int32))
    # two documents per row: the document mask is exercised too
    pos = jnp.asarray(
        np.tile(np.concatenate([np.arange(T // 2 + 1), np.arange(T - T // 2 - 1)]), (B, 1)).astype(np.int32)
    )
    seg = jnp.asarray(np.tile((np.arange(T) > T // 2).astype(np.int32), (B, 1)))
    return tok, pos, seg


def _model(changes, seed: int = 3):
    return lm.init_model(CFG.replace(**changes), key=jax.random.key(seed))


def _loss(m, tok, pos, seg, plan):
    logits = m(tok, pos, seg, plan=plan)
    targets = jnp.roll(tok, -1, axis=1)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1))


def _loss_and_grads(m, batch, plan):
    return eqx.filter_jit(eqx.filter_value_and_grad(_loss))(m, *batch, plan)


def _assert_same(a, b):
    (l1, g1), (l0, g0) = a, b
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    for x, y in zip(jax.tree.leaves(g1), jax.tree.leaves(g0), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------------- numerics
@pytest.mark.slow
def test_custom_policies_keep_loss_and_grads_one_device(one_device):
    batch = _batch(2, 12)
    ref = _loss_and_grads(_model({}), batch, one_device)
    for changes in POLICIES:
        _assert_same(_loss_and_grads(_model(changes), batch, one_device), ref)


@pytest.mark.slow
@pytest.mark.parametrize("changes", [OFFLOAD, dict(remat="custom", remat_context="device", remat_qkv="offload")])
def test_custom_policies_keep_loss_and_grads_ring_8_devices(ring, one_device, changes):
    """Zigzag ring over 4 devices x data 2: the flash residuals are tagged inside shard_map."""
    tok, pos, seg = _batch(2, 16, seed=1)
    perm = layout_permutation("zigzag", 16, 4)
    batch = tok[:, perm], pos[:, perm], seg[:, perm]
    ref = _loss_and_grads(_model({}), batch, one_device)
    _assert_same(_loss_and_grads(_model(changes), batch, ring), ref)


# ---------------------------------------------------------------------- what is saved, where
def _scan_residuals(changes, plan, B=1, T=12):
    """(bytes, on host?) of each residual the layer scan stacks ``[L, ...]`` for the backward,
    read from ``jax.ad_checkpoint.print_saved_residuals`` (lines like ``f32<host>[2,1,12,32]
    output of scan ...``)."""
    m = _model(changes)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_saved_residuals(lambda m: _loss(m, *_batch(B, T), plan), m)
    out = []
    for line in buf.getvalue().splitlines():
        r = re.match(r"(f32|bf16)(<host>)?\[([\d,]+)\] output of scan", line)
        if r and r[3].count(",") >= 2 and int(r[3].split(",")[0]) == CFG.n_layers:
            size = math.prod(int(d) for d in r[3].split(",")) * (4 if r[1] == "f32" else 2)
            out.append((size, r[2] is not None))
    return out


@pytest.mark.parametrize(
    "changes", [OFFLOAD, DEVICE, dict(remat="custom", remat_layer_input="offload", remat_context="device")]
)
def test_ledger_counts_exactly_the_saved_residuals(one_device, changes):
    B, T = 1, 12
    res = _scan_residuals(changes, one_device, B, T)
    host = sum(n for n, h in res if h)
    dev = sum(n for n, h in res if not h)
    cfg = CFG.replace(**changes)
    dev_tok, host_tok = cost.saved_bytes_per_token_per_layer(cfg, cost.ActivationPolicy.from_model(cfg), "float32")
    assert (dev, host) == (CFG.n_layers * B * T * dev_tok, CFG.n_layers * B * T * host_tok)
    if changes in (OFFLOAD, DEVICE):  # all of x, q/k/v, out, lse in float32
        assert host + dev == CFG.n_layers * B * T * 4 * (32 + (4 + 2 * 2) * 8 + 4 * 8 + 4)


def test_offload_reaches_the_lowered_program(one_device):
    """The host copies are ``annotate_device_placement`` custom calls with ``_xla_buffer_placement =
    "pinned_host"`` (JAX lowers them for TPU and GPU; on CPU device and host are the same RAM and
    the copy is dropped), so lower for TPU here: no accelerator is needed to see them."""
    tok, pos, seg = _batch(1, 12)

    def lowered(changes):
        f = jax.jit(jax.grad(lambda m: _loss(m, tok, pos, seg, one_device)))
        return f.trace(_model(changes)).lower(lowering_platforms=("tpu",)).as_text()

    off = lowered(OFFLOAD)
    assert off.count('_xla_buffer_placement = "pinned_host"') >= 4  # x, q/k/v, out/lse (fwd copies)
    assert "annotate_device_placement" in off
    for changes in (DEVICE, dict(remat="full"), {}):
        assert "annotate_device_placement" not in lowered(changes)


@pytest.mark.slow
def test_kept_context_skips_the_attention_replay(one_device):
    """Compiled FLOPs: keeping the flash residuals removes the attention forward from the backward."""
    tok, pos, seg = _batch(1, 64)

    def flops(changes):
        f = jax.jit(jax.grad(lambda m: _loss(m, tok, pos, seg, one_device)))
        ca = f.lower(_model(changes)).compile().cost_analysis()
        return (ca[0] if isinstance(ca, list) else ca)["flops"]

    replay, kept, kept_qkv = (
        flops(dict(remat="custom")),
        flops(dict(remat="custom", remat_context="offload")),
        flops(dict(remat="custom", remat_context="device", remat_qkv="device")),
    )
    assert kept < replay and kept_qkv < kept


# ---------------------------------------------------------------------- ledger and config
def test_ledger_moves_offloaded_bytes_to_host():
    cfg = lm.preset("llama3_1_8b_longctx")
    D, N, K, H, L = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.n_layers
    plan = Plan(
        mesh=(("data", 1), ("context", 64)),
        activations={"batch": "data", "seq": ("context",)},
        attention=AttentionConfig(strategy="ring"),
    )
    kw = dict(seq_len=4_194_304, global_batch=1, dtype="bfloat16")
    tokens = 4_194_304 // 64

    def mem(**changes):
        c = cfg.replace(**changes)
        return cost.memory_breakdown(c, plan, 64, policy=cost.ActivationPolicy.from_model(c), **kw)

    dev = mem(remat="custom", remat_context="device", remat_qkv="device")
    off = mem(remat="custom", remat_layer_input="offload", remat_context="offload", remat_qkv="offload")
    per_tok = 2 * D + 4 * (N * H + N) + 2 * (N + 2 * K) * H
    assert dev.activations == L * tokens * per_tok and dev.host == 0
    assert off.activations == 0 and off.host == dev.activations
    ctx = mem(remat="custom", remat_layer_input="offload", remat_context="offload")  # MaxText's recipe
    assert ctx.activations == 0 and ctx.host == L * tokens * (2 * D + 4 * (N * H + N))
    assert mem(remat="custom").activations == mem(remat="full").activations == L * tokens * 2 * D
    p = cost.ActivationPolicy.from_model(cfg.replace(remat="custom", remat_qkv="offload"), offload_optimizer=True)
    assert (p.remat, p.decoder_layer_input, p.context, p.qkv, p.offload_optimizer) == (
        "custom",
        "device",
        "remat",
        "offload",
        True,
    )
    assert p.label == "custom,ctx=remat,qkv=offload,opt>host"
    assert cost.ActivationPolicy.from_model(cfg) == cost.ActivationPolicy("full")


@pytest.mark.parametrize(
    "changes, words",
    [
        (dict(remat="custom", remat_context="host"), ["model.remat_context='host'", "device", "offload", "remat"]),
        (dict(remat="custom", remat_layer_input="remat"), ["model.remat_layer_input", "('device', 'offload')"]),
        (dict(remat="custom", remat_qkv="dev"), ["model.remat_qkv", "offload"]),
        (dict(remat="full", remat_context="offload"), ["model.remat_context='offload'", "remat=custom"]),
        (dict(remat_layer_input="offload"), ["model.remat_layer_input", "remat=custom"]),
    ],
)
def test_bad_placements_raise_before_anything_compiles(changes, words):
    with pytest.raises(ValueError) as e:
        lm.ModelConfig.from_dict({**CFG.to_dict(), **changes})
    for w in words:
        assert w in str(e.value)


def test_remat_policy_and_checkpoint_compatibility():
    with pytest.raises(ValueError, match="remat='custom'"):
        lm.remat_policy("full", remat_context="device")
    with pytest.raises(ValueError, match="remat_qkv"):
        lm.remat_policy("custom", remat_kv="device")
    with pytest.raises(ValueError, match="qkv"):
        cost.ActivationPolicy("custom", qkv="host")
    from lcx.training.resume import check_compatible

    old = {k: v for k, v in CFG.to_dict().items() if not k.startswith("remat_")}  # written before the placements
    check_compatible({"config": {"model": old}}, CFG.replace(**OFFLOAD).to_dict(), where="x")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ledger_none_set_is_what_jax_saves(one_device, dtype):
    """remat=none: the ledger's per-token saved bytes equal the residuals JAX's linearization of
    the layer scan keeps (``print_saved_residuals``), per token: the difference between two
    sequence lengths removes the per-layer constants (norm weights)."""
    cfg = CFG.replace(remat="none", dtype=dtype)

    def per_layer_bytes(T):
        m = lm.init_model(cfg, key=jax.random.key(0))
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            print_saved_residuals(lambda m: _loss(m, *_batch(1, T), one_device), m)
        total = 0
        for line in buf.getvalue().splitlines():
            r = re.match(r"(f32|bf16|i32)\[([\d,]+)\] output of scan", line)
            if r and int(r[2].split(",")[0]) == cfg.n_layers:
                total += math.prod(int(d) for d in r[2].split(",")) * (2 if r[1] == "bf16" else 4)
        return total

    per_token = (per_layer_bytes(24) - per_layer_bytes(12)) // (cfg.n_layers * 12)
    want = cost.saved_bytes_per_token_per_layer(cfg, cost.ActivationPolicy("none"), dtype)
    assert (per_token, 0) == want
