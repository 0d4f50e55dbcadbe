"""Tests for lcx.models: forward pass against an independent float64 NumPy Llama, RoPE with
per-document positions, GQA vs repeated-K/V MHA, scan vs loop, remat, bf16, parameter sharding,
configs and presets.

Public functions are called through ``jaxtyping.jaxtyped(typechecker=beartype)`` so every shape
and dtype annotation is checked.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _compile_cache import compile_cache
from beartype import beartype
from jax.sharding import PartitionSpec as P
from jaxtyping import TypeCheckError, jaxtyped
from omegaconf import OmegaConf

import lcx.models as lm
from lcx.sharding import AttentionConfig, Plan, bind, layout_permutation

check = jaxtyped(typechecker=beartype)
init_model = check(lm.init_model)
forward = check(lm.Llama.__call__)
logical_axes = check(lm.logical_axes)

CFG = lm.ModelConfig(
    name="test", vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64
)
CONF_DIR = pathlib.Path(__file__).resolve().parent.parent / "conf" / "model"


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    """The one-device reference forwards below repeat each other's programs: compile each once."""
    with compile_cache(tmp_path_factory.mktemp("xla_cache")):
        yield


@pytest.fixture(scope="module")
def one_device():
    """A one-device plan: batch rule present but nothing actually split (cheapest to compile)."""
    return bind(Plan(mesh=(("data", -1),), activations={"batch": "data"}), jax.devices()[:1])


def packed(doc_lengths: list[list[int]], vocab: int, seed: int = 0):
    """tokens, positions, segment_ids int32 [B, T] for rows of packed documents."""
    rng = np.random.default_rng(seed)
    pos = np.array([np.concatenate([np.arange(n) for n in row]) for row in doc_lengths], np.int32)
    seg = np.array([np.concatenate([np.full(n, i) for i, n in enumerate(row)]) for row in doc_lengths], np.int32)
    tok = rng.integers(0, vocab, pos.shape).astype(np.int32)
    return jnp.asarray(tok), jnp.asarray(pos), jnp.asarray(seg)


def with_config(model, cfg: lm.ModelConfig):
    """``model``'s parameters under another config (the config is a static field, so no tree_at)."""
    skeleton = eqx.filter_eval_shape(lm.init_model, cfg, key=jax.random.key(0))
    return jax.tree.unflatten(jax.tree.structure(skeleton), jax.tree.leaves(model))


def run(model, tok, pos, seg, plan):
    return eqx.filter_jit(lambda m, t, p, s: forward(m, t, p, s, plan=plan))(model, tok, pos, seg)


# ---------------------------------------------------------------------- independent reference
def meta_rope_frequencies(H, theta, factor, old_context_len, low_freq_factor=1.0, high_freq_factor=4.0):
    """RoPE frequencies, with Llama 3.1 scaling as in Meta's llama-models ``apply_scaling``."""
    freqs = [theta ** (-2.0 * i / H) for i in range(H // 2)]
    if factor is None:
        return np.array(freqs)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < high_freq_wavelen:
            out.append(f)
        elif wavelen > low_freq_wavelen:
            out.append(f / factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append((1 - smooth) * f / factor + smooth * f)
    return np.array(out)


def numpy_llama(model, cfg, tokens, positions, segment_ids):
    """The Llama forward pass in float64 NumPy, written from the papers, sharing no lcx code.

    RoPE uses complex multiplication of the pairs (x_i, x_{i+H/2}); GQA repeats K/V to N heads.
    """
    w = jax.tree.map(lambda a: np.asarray(a, np.float64), model)
    H, G = cfg.head_dim, cfg.n_heads // cfg.n_kv_heads
    tokens, pos, seg = (np.asarray(a) for a in (tokens, positions, segment_ids))

    def rms(x, g):
        return x / np.sqrt(np.mean(x**2, -1, keepdims=True) + cfg.norm_eps) * g

    freq = meta_rope_frequencies(H, cfg.rope_theta, cfg.rope_scaling_factor, cfg.rope_original_max_len)

    def rotary(x):  # [B, T, n, H]
        z = x[..., : H // 2] + 1j * x[..., H // 2 :]
        z = z * np.exp(1j * pos[:, :, None, None] * freq)
        return np.concatenate([z.real, z.imag], -1)

    vis = pos[:, None, :] <= pos[:, :, None]  # [B, T(query), S(key)]
    if cfg.document_mask:
        vis &= seg[:, None, :] == seg[:, :, None]
    if cfg.sliding_window is not None:
        vis &= pos[:, :, None] - pos[:, None, :] < cfg.sliding_window

    x = w.embed.weight[tokens]
    for l in range(cfg.n_layers):
        b = jax.tree.map(lambda a: a[l], w.blocks)
        h = rms(x, b.attn_norm.weight)
        q = rotary(np.einsum("btd,dnh->btnh", h, b.attn.wq))
        k = np.repeat(rotary(np.einsum("btd,dkh->btkh", h, b.attn.wk)), G, axis=2)
        v = np.repeat(np.einsum("btd,dkh->btkh", h, b.attn.wv), G, axis=2)
        s = np.einsum("btnh,bsnh->bnts", q, k) / math.sqrt(H)
        s = np.where(vis[:, None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        x = x + np.einsum("bnts,bsnh,nhd->btd", p, v, b.attn.wo)
        h = rms(x, b.mlp_norm.weight)
        gate = h @ b.mlp.w_gate
        x = x + (gate / (1 + np.exp(-gate)) * (h @ b.mlp.w_up)) @ b.mlp.w_down
    x = rms(x, w.final_norm.weight)
    head = w.embed.weight.T if cfg.tie_embeddings else w.head
    return x @ head


@pytest.mark.slow
@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"tie_embeddings": True, "sliding_window": 3},
        {"document_mask": False, "n_kv_heads": 1},
        # wavelengths 6.3 (interpolated band), 63, 628, 6283 tokens (stretched 8x)
        {"rope_scaling_factor": 8.0, "rope_original_max_len": 16},
    ],
    ids=["gqa", "tied_window", "mqa_nodocmask", "llama31_rope_scaling"],
)
def test_forward_matches_numpy_reference(one_device, changes):
    cfg = CFG.replace(**changes)
    model = init_model(cfg, key=jax.random.key(0))
    tok, pos, seg = packed([[5, 7], [12]], cfg.vocab_size)
    logits = run(model, tok, pos, seg, one_device)
    assert logits.shape == (2, 12, cfg.vocab_size) and logits.dtype == jnp.float32
    np.testing.assert_allclose(logits, numpy_llama(model, cfg, tok, pos, seg), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_documents_are_independent_and_layout_free(one_device):
    """Packed documents with restarting positions give each document's stand-alone output, in
    any token order (positions and segment ids travel with their tokens)."""
    model = init_model(CFG, key=jax.random.key(1))
    tok, pos, seg = packed([[7, 9]], CFG.vocab_size)
    both = run(model, tok, pos, seg, one_device)
    for sl in (slice(0, 7), slice(7, 16)):
        alone = run(model, tok[:, sl], pos[:, sl], jnp.zeros_like(seg[:, sl]), one_device)
        np.testing.assert_allclose(both[:, sl], alone, rtol=1e-5, atol=1e-5)
    perm = layout_permutation("zigzag", 16, 4)
    shuffled = run(model, tok[:, perm], pos[:, perm], seg[:, perm], one_device)
    np.testing.assert_allclose(shuffled, both[:, perm], rtol=1e-5, atol=1e-5)


def test_gqa_equals_mha_with_repeated_kv(one_device):
    """Query head n uses kv head n // G: repeating each kv head G times gives an MHA model
    (K = N) with the same outputs."""
    model = init_model(CFG, key=jax.random.key(2))
    G = CFG.group_size
    repeated = eqx.tree_at(
        lambda m: (m.blocks.attn.wk, m.blocks.attn.wv),
        model,
        (
            jnp.repeat(model.blocks.attn.wk, G, axis=2),  # [L, D, K, H] -> [L, D, N, H]
            jnp.repeat(model.blocks.attn.wv, G, axis=2),
        ),
    )
    mha = with_config(repeated, CFG.replace(n_kv_heads=CFG.n_heads))
    tok, pos, seg = packed([[6, 6], [12]], CFG.vocab_size)
    np.testing.assert_allclose(
        run(model, tok, pos, seg, one_device), run(mha, tok, pos, seg, one_device), rtol=1e-5, atol=1e-5
    )


def test_scan_equals_python_loop(one_device):
    model = init_model(CFG, key=jax.random.key(3))
    tok, pos, seg = packed([[4, 8]], CFG.vocab_size)

    @jax.jit
    def loop(model, tok, pos, seg):
        x = model.embed(tok)
        for l in range(CFG.n_layers):
            block = jax.tree.map(lambda a: a[l], model.blocks)
            x = block(x, pos, seg, layer=model.layer_options(CFG.layer_kinds[l]), plan=one_device)
        x = model.final_norm(x)
        return jnp.einsum("BTD,DV->BTV", x, model.head)

    np.testing.assert_allclose(run(model, tok, pos, seg, one_device), loop(model, tok, pos, seg), rtol=1e-6, atol=1e-6)


def _loss_and_grads(model, tok, pos, seg, plan):
    def loss(m):
        logits = m(tok, pos, seg, plan=plan)
        targets = jnp.roll(tok, -1, axis=1)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1))

    return eqx.filter_jit(eqx.filter_value_and_grad(loss))(model)


@pytest.mark.slow
def test_remat_keeps_loss_and_grads(one_device):
    model = init_model(CFG, key=jax.random.key(4))
    tok, pos, seg = packed([[5, 7]], CFG.vocab_size)
    loss0, g0 = _loss_and_grads(model, tok, pos, seg, one_device)
    for policy in ("full", "dots_saveable"):
        m = with_config(model, CFG.replace(remat=policy))
        loss1, g1 = _loss_and_grads(m, tok, pos, seg, one_device)
        np.testing.assert_allclose(loss1, loss0, rtol=1e-6)
        for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_bfloat16_compute_close_to_float32(one_device):
    model = init_model(CFG, key=jax.random.key(5))
    tok, pos, seg = packed([[5, 7], [12]], CFG.vocab_size)
    ref = run(model, tok, pos, seg, one_device)
    bf = run(with_config(model, CFG.replace(dtype="bfloat16")), tok, pos, seg, one_device)
    assert bf.dtype == jnp.float32  # logits stay float32
    assert model.blocks.attn.wq.dtype == jnp.float32  # master weights untouched
    # bfloat16 keeps 8 significant bits: one rounding moves a value by up to 2^-9 of itself.
    # Activations and weights are rounded at every matmul of 2 layers and the head; measured
    # error is ~2.5 bf16 spacings (2^-8) of the largest logit, so bound it by 4
    top = float(jnp.max(jnp.abs(ref)))
    err = float(jnp.max(jnp.abs(bf - ref)))
    assert 0 < err < 4 * 2**-8 * top, (err, top)


def test_rope_relative_positions():
    """<rope(q, m), rope(k, n)> depends on m - n only (RoFormer, eq. 16); position 0 is identity."""
    q, k = jax.random.normal(jax.random.key(6), (2, 1, 1, 1, 16))
    rope = check(lm.rope)
    freq = check(lm.rope_frequencies)(16, theta=10_000.0)

    def dot(m, n):
        pm, pn = jnp.array([[m]], jnp.int32), jnp.array([[n]], jnp.int32)
        return jnp.sum(rope(q, pm, freq) * rope(k, pn, freq))

    np.testing.assert_allclose(rope(q, jnp.zeros((1, 1), jnp.int32), freq), q)
    np.testing.assert_allclose(dot(3, 0), dot(40, 37), rtol=1e-5)
    np.testing.assert_allclose(dot(0, 5), dot(20, 25), rtol=1e-5)


@pytest.mark.parametrize("H, theta, factor", [(128, 500_000.0, 8.0), (128, 500_000.0, None), (16, 10_000.0, 32.0)])
def test_rope_frequencies_match_meta_llama31_scaling(H, theta, factor):
    got = check(lm.rope_frequencies)(H, theta=theta, scaling_factor=factor, original_max_len=8192)
    np.testing.assert_allclose(got, meta_rope_frequencies(H, theta, factor, 8192), rtol=1e-6)


def test_typecheck_rejects_float_positions(one_device):
    model = init_model(CFG, key=jax.random.key(0))
    tok, pos, seg = packed([[4]], CFG.vocab_size)
    with pytest.raises(TypeCheckError):
        forward(model, tok, pos.astype(jnp.float32), seg, plan=one_device)


# ---------------------------------------------------------------------- sharding
FSDP = Plan(mesh=(("fsdp", 8),), params={"embed": "fsdp"}, activations={"batch": "fsdp"})


def test_logical_axes_cover_every_parameter():
    model = init_model(CFG, key=jax.random.key(0))
    axes = logical_axes(model)
    pairs = jax.tree.leaves(jax.tree.map(lambda a, ax: (a, ax), model, axes), is_leaf=lambda x: isinstance(x, tuple))
    assert len(pairs) == len(jax.tree.leaves(model)) == 12  # embed, 9 per block, final norm, head
    for a, ax in pairs:
        assert isinstance(ax, tuple) and len(ax) == a.ndim
    assert axes.blocks.attn.wq == ("layers", "embed", "heads", "head_dim")
    assert axes.blocks.mlp.w_down == ("layers", "mlp", "embed")
    assert axes.head == ("embed", "vocab")
    tied = logical_axes(init_model(CFG.replace(tie_embeddings=True), key=jax.random.key(0)))
    assert tied.head is None and len(jax.tree.leaves(tied, is_leaf=lambda x: isinstance(x, tuple))) == 11


def test_shard_model_fsdp_specs_and_forward(devices, one_device):
    mp = bind(FSDP, devices)
    model = init_model(CFG, key=jax.random.key(7))
    sharded = lm.shard_model(model, mp)
    expected = {
        "embed.weight": P(None, "fsdp"),
        "blocks.attn_norm.weight": P(None, "fsdp"),
        "blocks.attn.wq": P(None, "fsdp", None, None),
        "blocks.attn.wk": P(None, "fsdp", None, None),
        "blocks.attn.wo": P(None, None, None, "fsdp"),
        "blocks.mlp.w_gate": P(None, "fsdp", None),
        "blocks.mlp.w_down": P(None, None, "fsdp"),
        "final_norm.weight": P("fsdp"),
        "head": P("fsdp", None),
    }
    for path, spec in expected.items():
        leaf = eval("sharded." + path)
        assert leaf.sharding.spec == spec, path
        assert leaf.sharding.mesh == mp.mesh
    assert all(isinstance(s, jax.sharding.NamedSharding) for s in jax.tree.leaves(lm.model_shardings(model, mp)))
    tok, pos, seg = packed([[3, 5]] * 8, CFG.vocab_size)
    np.testing.assert_allclose(
        run(sharded, tok, pos, seg, mp), run(model, tok, pos, seg, one_device), rtol=1e-5, atol=1e-5
    )


@pytest.mark.slow
def test_init_sharded_creates_the_same_parameters_in_shards(devices):
    mp = bind(FSDP, devices)
    direct = check(lm.init_sharded)(CFG, mp, key=jax.random.key(7))
    model = init_model(CFG, key=jax.random.key(7))
    for a, b, s in zip(
        jax.tree.leaves(direct), jax.tree.leaves(model), jax.tree.leaves(lm.model_shardings(model, mp)), strict=True
    ):
        assert a.sharding == s
        # The same draws: the random bits are partitionable (identical on any sharding), but XLA
        # evaluates the normal transform (sqrt(2) erfinv(u): a degree-8 polynomial by Horner, a
        # log, three products) with other vector loops per shard, and on CPU a loop's fused
        # multiply-adds round differently from its remainder's mul + add. Each of those ~12
        # roundings may then differ by 1 ULP, so the bound is 16 (measured: 3 ULP on an AVX-512 EPYC
        # host, at most 2 on the one this test was written on). A draw from another key differs by
        # millions of ULP (checked below), so 16 still tells the same draws from others.
        np.testing.assert_array_max_ulp(np.asarray(a), np.asarray(b), maxulp=16)
    other = init_model(CFG, key=jax.random.key(8))
    with pytest.raises(AssertionError):
        np.testing.assert_array_max_ulp(np.asarray(direct.head), np.asarray(other.head), maxulp=16)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["allgather", "a2a", "ring", "usp"])
def test_context_parallel_forward(devices, one_device, strategy):
    """Sequence split 4 ways (zigzag) x batch 2 ways: same logits as the unsplit model."""
    seq = ("ulysses", "ring") if strategy == "usp" else ("context",)
    mesh = (("data", 2),) + ((("ulysses", 2), ("ring", 2)) if strategy == "usp" else (("context", 4),))
    plan = Plan(
        mesh=mesh,
        activations={"batch": "data", "seq": seq},
        attention=AttentionConfig(strategy=strategy, layout="zigzag", block_q=2, block_kv=2),
    )
    plan.validate(8, dims=CFG.dims(), seq_len=16, global_batch=2)
    model = init_model(CFG, key=jax.random.key(8))
    tok, pos, seg = packed([[9, 7], [16]], CFG.vocab_size)
    perm = layout_permutation("zigzag", 16, 4)
    tok, pos, seg = tok[:, perm], pos[:, perm], seg[:, perm]
    cp = run(model, tok, pos, seg, bind(plan, devices))
    np.testing.assert_allclose(cp, run(model, tok, pos, seg, one_device), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------- configs
def test_parameter_counts():
    c70 = lm.preset("llama3_70b")
    assert c70.params_per_layer == 855_638_016
    assert c70.n_params == 70_553_706_496
    c8 = lm.preset("llama3_1_8b")
    assert c8.n_params == 8_030_261_248
    assert lm.preset("llama3_1_8b_longctx").n_params == c8.n_params  # 16 x 256 = 32 x 128 = D
    assert c8.group_size == 4 and lm.preset("llama3_1_8b_longctx").group_size == 4
    # the analytic count matches the arrays the model actually holds
    abstract = eqx.filter_eval_shape(lm.init_model, CFG, key=jax.random.key(0))
    assert sum(math.prod(a.shape) for a in jax.tree.leaves(abstract)) == CFG.n_params
    assert lm.preset("tiny").dims() == {
        "vocab": 256,
        "embed": 128,
        "heads": 4,
        "kv_heads": 1,
        "head_dim": 32,
        "mlp": 384,
        "layers": 2,
    }


def test_presets_are_the_yaml_files():
    # lcx.models reads its presets from conf/model/: one place for their values (model=hf, a
    # checkpoint's config.json read at the config edge, is the one file that is no preset)
    assert sorted(lm.PRESETS) == sorted(p.stem for p in CONF_DIR.glob("*.yaml") if p.stem != "hf")
    assert OmegaConf.is_missing(OmegaConf.load(CONF_DIR / "hf.yaml"), "path")


@pytest.mark.parametrize("name", sorted(lm.PRESETS))
def test_yaml_presets_equal_code_presets(name):
    d = OmegaConf.to_container(OmegaConf.load(CONF_DIR / f"{name}.yaml"), resolve=True)
    assert list(d) == [f.name for f in dataclasses.fields(lm.ModelConfig)]  # exactly the fields
    if d["vocab_size"] is None:  # the tokenizer's, at the config edge; in code the byte tokenizer's 256
        d["vocab_size"] = 256
    assert lm.ModelConfig.from_dict(d) == lm.preset(name)
    assert lm.preset(name).to_dict() == d


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"n_heads": 6, "n_kv_heads": 4}, ["n_heads=6", "n_kv_heads=4", "divisor"]),
        ({"d_model": 0}, ["d_model", "positive"]),
        ({"remat": "some"}, ["remat", "dots_saveable"]),
        ({"dtype": "float16"}, ["dtype", "bfloat16"]),
        ({"sliding_window": 0}, ["sliding_window"]),
        ({"head_dim": 7}, ["head_dim=7", "even"]),
        ({"rope_scaling_factor": 0.5}, ["rope_scaling_factor", ">= 1"]),
    ],
)
def test_config_validation(changes, words):
    with pytest.raises(ValueError) as e:
        CFG.replace(**changes)
    for w in words:
        assert w in str(e.value)


def test_from_dict_and_preset_errors():
    with pytest.raises(ValueError, match="unknown model config keys \\['d_modle'\\]"):
        lm.ModelConfig.from_dict({"d_modle": 4})
    with pytest.raises(ValueError, match="llama3_70b"):
        lm.preset("llama4")
    assert lm.ModelConfig.from_dict({"rope_theta": 500000}).rope_theta == 500000.0
