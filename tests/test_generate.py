"""Context-parallel generation (lcx.generate): exactness against single-device decoding and
teacher forcing, for every strategy, the three layouts, GQA, sinks, sliding and chunked layers.

The reference is teacher forcing: the model's own forward (``Llama.__call__``, one device) over
prompt + generated tokens. Greedy decoding must pick its argmax at every step and its logits must
be within 1e-5 of the decoding logits; CP decoding (every registered strategy, or ring for global
layers with halo for sliding and chunked ones; 4 context devices x 2 data, 8 context devices, or 4
context x 2 tensor devices splitting the heads) must emit exactly the single-device tokens. Shapes are tiny (vocabulary 64, width 32, 3 layers) and the
prompts have different lengths (29 and 17 tokens, padded to 32 as zigzag needs), so the padding,
the append rule, the sliding ring (window 5, chunk 5: ring of 8 slots, wrapped during decoding)
and the per-row positions are all exercised.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lcx.generate import cache_bytes_per_device, decode_step, generate, prefill, sample
from lcx.generate.prompts import padded_length
from lcx.models import LayerKind, ModelConfig, init_model
from lcx.sharding import AttentionConfig, Plan, PlanError, bind

LOGIT_TOL = 1e-5  # the bound, never loosened
NEW = 7  # tokens generated per row: the sliding ring (8 slots) wraps during decoding
LENGTHS = (29, 17)
WINDOW, CHUNK = 5, 5  # halo needs W - 1 <= a zigzag chunk (32 / 8 = 4 tokens)

MODELS = {
    # uniform global attention, GQA (4 query heads on 2 kv heads)
    "gqa": ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64),
    # sliding (with sinks), chunked and global layers; GQA; 3 layers of a 3-kind period
    "hybrid": ModelConfig(
        vocab_size=64,
        d_model=32,
        n_layers=3,
        n_heads=4,
        n_kv_heads=2,
        head_dim=8,
        mlp_dim=64,
        layer_pattern=(
            LayerKind("sliding", window=WINDOW, sinks=True),
            LayerKind("chunked", chunk=CHUNK),
            LayerKind("global", sinks=True),
        ),
    ),
    # every family option (biases, QK-norm, query_pre_attn_scalar, (1 + w) gains, sandwich norms,
    # GeGLU, scaled embeddings) with Gemma 3's kinds: sliding, and global with its own RoPE; 5
    # layers: decoding scans 2 periods of 2 kinds, then 1 remainder layer
    "family": ModelConfig(
        vocab_size=64,
        d_model=32,
        n_layers=5,
        n_heads=4,
        n_kv_heads=2,
        head_dim=8,
        mlp_dim=64,
        attention_bias=True,
        qk_norm=True,
        query_pre_attn_scalar=12.0,
        norm_gain_offset=1.0,
        post_norms=True,
        mlp_activation="gelu_tanh",
        scale_embeddings=True,
        layer_pattern=(
            LayerKind("sliding", window=WINDOW),
            LayerKind("global", rope_theta=1e6, rope_scaling_type="linear", rope_scaling_factor=4.0),
        ),
    ),
}

MESHES = {  # name: (mesh, activation rules)
    "dp2-cp4": ((("data", 2), ("context", 4)), {"batch": "data", "seq": "context"}),
    "cp8": ((("context", 8),), {"seq": "context"}),  # 7 new tokens: one device gets none appended
    "tp2-cp4": ((("tensor", 2), ("context", 4)), {"seq": "context", "heads": "tensor"}),  # heads split
    "usp": ((("data", 2), ("ulysses", 2), ("ring", 2)), {"batch": "data", "seq": ("ulysses", "ring")}),
}
HYBRID_HALO = {"global": "ring", "sliding": "halo", "chunked": "halo"}


@functools.cache
def model(name: str):
    m = init_model(MODELS[name], key=jax.random.key(0))
    if m.blocks.attn.sinks is not None:  # non-zero sink logits, so a wrong merge shows
        sinks = jax.random.normal(jax.random.key(1), m.blocks.attn.sinks.shape)
        m = eqx.tree_at(lambda t: t.blocks.attn.sinks, m, sinks)
    if name == "family":  # zero biases and unit gains would hide a dropped option: perturb every leaf
        leaves, treedef = jax.tree.flatten(m)
        keys = jax.random.split(jax.random.key(2), len(leaves))
        m = jax.tree.unflatten(treedef, [x + 0.2 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    return m


def prompts():
    rng = np.random.default_rng(0)
    return [rng.integers(0, 64, n) for n in LENGTHS]


def plan(strategy, layout="zigzag", kernel="xla", blocks=(8, 16), mesh="dp2-cp4"):
    usp = strategy == "usp"
    attn = {"strategy": strategy, "layout": layout, "kernel": kernel, "block_q": blocks[0], "block_kv": blocks[1]}
    if usp:
        attn |= {"ulysses_axis": "ulysses", "ring_axis": "ring"}
    axes, rules = MESHES["usp" if usp else mesh]
    return bind(Plan(mesh=axes, activations=rules, attention=AttentionConfig(**attn)))


@functools.cache
def single_plan():
    return bind(Plan(mesh=(("data", 1),), activations={"batch": "data"}), jax.devices()[:1])


def greedy(m, mp, n=NEW):
    """``(tokens [B, n], logits [B, n, V])`` of greedy decoding with prefill + decode_step."""
    pre = prefill(m, prompts(), plan=mp, max_new_tokens=n)
    logits, state, toks, steps = pre.logits, pre.state, [], []
    for _ in range(n):
        steps.append(np.asarray(logits))
        tok = sample(logits, None, temperature=0.0, top_p=1.0)
        toks.append(np.asarray(tok))
        logits, state = decode_step(m, state, tok, layout=pre.layout, plan=mp)
    return np.stack(toks, 1)[: pre.rows], np.stack(steps, 1)[: pre.rows]


@functools.cache
def reference(name: str):
    """Single-device greedy decoding and the teacher-forced logits of its tokens ``[B, NEW, V]``."""
    m = model(name)
    toks, logits = greedy(m, single_plan())
    T = max(LENGTHS) + NEW + 1
    full = np.zeros((len(LENGTHS), T), np.int32)
    seg = np.full((len(LENGTHS), T), -1, np.int32)
    for b, (p, n) in enumerate(zip(prompts(), LENGTHS)):
        full[b, :n], full[b, n : n + NEW], seg[b, : n + NEW] = p, toks[b], 0
    pos = np.broadcast_to(np.arange(T, dtype=np.int32), full.shape)
    tf = np.asarray(m(jnp.asarray(full), jnp.asarray(pos), jnp.asarray(seg), plan=single_plan()))
    forced = np.stack([tf[b, n - 1 : n - 1 + NEW] for b, n in enumerate(LENGTHS)])
    return toks, logits, forced


@pytest.mark.parametrize("name", MODELS)
def test_single_device_decoding_is_teacher_forcing(name):
    toks, logits, forced = reference(name)
    np.testing.assert_array_equal(toks, forced.argmax(-1))
    err = np.abs(logits - forced).max()
    assert err <= LOGIT_TOL, f"{name}: decode logits differ from teacher forcing by {err:.2e}"


CP_CASES = [  # (model, strategy, layout, mesh)
    *[("hybrid", s, "zigzag", "dp2-cp4") for s in ("allgather", "a2a", "ring", "usp")],
    ("hybrid", HYBRID_HALO, "zigzag", "dp2-cp4"),
    ("hybrid", "ring", "contiguous", "dp2-cp4"),
    ("hybrid", "ring", "balanced", "dp2-cp4"),
    ("hybrid", "ring", "zigzag", "cp8"),
    ("hybrid", "ring", "zigzag", "tp2-cp4"),
    ("gqa", "a2a", "balanced", "dp2-cp4"),
    ("gqa", "allgather", "contiguous", "dp2-cp4"),
    ("family", {"global": "ring", "sliding": "halo"}, "zigzag", "dp2-cp4"),
]


def _case_id(case):
    name, s, layout, mesh = case
    return f"{name}-{'ring+halo' if isinstance(s, dict) else s}-{layout}-{mesh}"


@pytest.mark.parametrize("case", CP_CASES, ids=_case_id)
def test_cp_decoding_equals_single_device(case):
    name, strategy, layout, mesh = case
    toks, logits = greedy(model(name), plan(strategy, layout, mesh=mesh))
    ref_toks, _, forced = reference(name)
    np.testing.assert_array_equal(toks, ref_toks)
    err = np.abs(logits - forced).max()
    assert err <= LOGIT_TOL, f"{_case_id(case)}: logits differ from teacher forcing by {err:.2e}"


def test_short_prompts_under_halo_are_padded_not_refused():
    """Prompts of 6 and 3 tokens on dp2-cp4 zigzag pad to 8 tokens, 1 per layout chunk, less than
    the W - 1 = 4 keys halo must fetch: they pad on to 32 (4 per chunk), the shortest length halo
    runs, and decode as on one device. A plan halo cannot run at any length is still refused."""
    m, mp = model("hybrid"), plan(HYBRID_HALO)
    short = [p[:n] for p, n in zip(prompts(), (6, 3))]
    masks = [m.layer_options(k).mask for k in m.config.layer_kinds]
    assert padded_length(6, mp, masks) == 32 and padded_length(6, plan("ring"), masks) == 8
    pre, ref = (prefill(m, short, plan=p, max_new_tokens=NEW) for p in (mp, single_plan()))
    err = np.abs(np.asarray(pre.logits)[:2] - np.asarray(ref.logits)[:2]).max()
    assert err <= LOGIT_TOL, f"prefill logits of padded short prompts differ by {err:.2e}"
    np.testing.assert_array_equal(
        generate(m, short, plan=mp, max_new_tokens=NEW), generate(m, short, plan=single_plan(), max_new_tokens=NEW)
    )
    with pytest.raises(PlanError, match="halo serves sliding and chunked layers only, not the global kind"):
        prefill(m, short, plan=plan({**HYBRID_HALO, "global": "halo"}), max_new_tokens=NEW)


@pytest.mark.slow
def test_cp_decoding_splash_kernel():
    """The prefill under the Pallas splash kernel (interpret mode on CPU)."""
    toks, logits = greedy(model("hybrid"), plan(HYBRID_HALO, kernel="splash", blocks=(128, 128)))
    ref_toks, _, forced = reference("hybrid")
    np.testing.assert_array_equal(toks, ref_toks)
    assert np.abs(logits - forced).max() <= LOGIT_TOL


@pytest.mark.slow  # ~50 s on 2 cores; the floor runs decoding under CP (test_cp_decoding_*)
def test_generate_loop_batch_padding_eos_and_sampling():
    """generate(): the compiled loop gives the step-by-step tokens; a batch of 3 rows on a data
    degree of 2 (padded, the pad row dropped); EOS stops a row; seeded sampling is reproducible
    and the same on one device and under CP."""
    m, mp = model("hybrid"), plan("ring")
    ref_toks = reference("hybrid")[0]
    three = prompts() + [prompts()[0][:5]]
    out = np.asarray(generate(m, three, plan=mp, max_new_tokens=NEW))
    assert out.shape == (3, NEW) and out.dtype == np.int32
    np.testing.assert_array_equal(out[:2], ref_toks)
    eos = int(ref_toks[0, 2])
    stop = np.asarray(generate(m, prompts(), plan=mp, max_new_tokens=NEW, eos_id=eos))
    first = [int(np.argmax(r == eos)) if (r == eos).any() else NEW for r in ref_toks]
    for b in range(2):
        np.testing.assert_array_equal(stop[b, : first[b] + 1], ref_toks[b, : first[b] + 1])
        assert (stop[b, first[b] + 1 :] == eos).all()
    kw = dict(max_new_tokens=NEW, temperature=0.8, top_p=0.9, key=jax.random.key(3))
    a = np.asarray(generate(m, prompts(), plan=mp, **kw))
    b = np.asarray(generate(m, prompts(), plan=single_plan(), **kw))
    np.testing.assert_array_equal(a, b)
    c = np.asarray(generate(m, prompts(), plan=mp, **(kw | {"key": jax.random.key(4)})))
    assert not np.array_equal(a, c)


def test_sample_top_p_and_temperature():
    logits = jnp.asarray([[0.0, 3.0, 1.0, -1.0], [2.0, 0.0, 2.5, 0.0]], jnp.float32)
    np.testing.assert_array_equal(sample(logits, None, temperature=0.0, top_p=1.0), [1, 2])
    keys = jax.random.split(jax.random.key(0), 64)
    # a nucleus below the top token's probability keeps only the top token
    draws = np.stack([sample(logits, k, temperature=1.0, top_p=0.3) for k in keys])
    assert (draws == [1, 2]).all()
    free = np.stack([sample(logits, k, temperature=5.0, top_p=1.0) for k in keys])
    assert len(np.unique(free[:, 0])) > 1


def test_cache_is_one_pth_per_device():
    """The ledger equals the bytes each device holds, and P = 4 holds 1/4 of one device's
    prompt slots (plus its share of the appended slots)."""
    m = model("hybrid")
    sizes = {}
    for key, mp, P in (("cp", plan("ring"), 4), ("single", single_plan(), 1)):
        pre = prefill(m, prompts(), plan=mp, max_new_tokens=NEW)
        held = sum(
            s.data.nbytes
            for leaf in jax.tree.leaves(pre.state.caches)
            for s in leaf.addressable_shards
            if s.device == mp.mesh.devices.flat[0]
        )
        local_batch = 1 if P == 4 else 2
        ledger = cache_bytes_per_device(
            pre.layout, local_batch=local_batch, kv_heads=2, head_dim=8, bytes_per_element=4
        )
        assert held == ledger, (key, held, ledger)
        sizes[key] = (ledger, [g.local_slots for g in pre.layout.groups])
        if P == 1:  # a full cache is refused, not silently overwritten
            state, tok = pre.state, jnp.zeros((2,), jnp.int32)
            for _ in range(NEW):
                _, state = decode_step(m, state, tok, layout=pre.layout, plan=mp)
            with pytest.raises(ValueError, match="max_new_tokens=7 decode steps"):
                decode_step(m, state, tok, layout=pre.layout, plan=mp)
    # global group: 32 / 4 prompt slots (29 tokens padded to 2P = 8) + ceil(7 / 4) appended, one
    # device: 30 (29 padded to 2) + 7; ring: ceil(5 / 4) slots per device, 5 on one device
    assert sizes["cp"][1] == [8 + 2, 2] and sizes["single"][1] == [30 + 7, 5]


@pytest.mark.parametrize(
    ("prompts_", "kwargs", "match"),
    [
        ([np.arange(5), np.zeros(0, np.int32)], {}, "prompt 1 is empty"),
        ([], {}, "no prompts"),
        ([np.array([3, 64])], {}, "outside \\[0, 64\\)"),
        ([np.arange(5)], {"max_new_tokens": 0}, "max_new_tokens=0"),
        ([np.arange(5)], {"temperature": 1.0}, "key=jax.random.key"),
        ([np.arange(5)], {"top_p": 0.0}, "top_p=0.0"),
        (np.zeros((2, 3, 4), np.int32), {}, "int \\[batch, tokens\\]"),
        ([np.array([1.0, 2.0])], {}, "integer token ids"),
    ],
)
def test_bad_requests_are_refused_before_compiling(prompts_, kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate(model("gqa"), prompts_, plan=single_plan(), **({"max_new_tokens": 2} | kwargs))


def test_an_int32_batch_array_is_the_list_of_its_rows():
    rows = np.random.default_rng(1).integers(0, 64, (2, 6)).astype(np.int32)
    a = generate(model("gqa"), rows, plan=single_plan(), max_new_tokens=2)
    b = generate(model("gqa"), list(rows), plan=single_plan(), max_new_tokens=2)
    np.testing.assert_array_equal(a, b)


def test_prompt_beyond_the_rope_range_is_refused_naming_both():
    cfg = ModelConfig(
        vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64,
        rope_original_max_len=16,
    )  # fmt: skip
    m = init_model(cfg, key=jax.random.key(0))
    with pytest.raises(ValueError, match="prompt of 14 tokens.*position 16.*rope_original_max_len=16"):
        generate(m, [np.arange(14)], plan=single_plan(), max_new_tokens=3)
