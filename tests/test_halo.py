"""The ``halo`` strategy (:mod:`lcx.attention.strategies.halo`) on 8 simulated CPU devices.

Through the public ``lcx.attention.attention`` with ``plan.attention.strategy="halo"``, forward
(out, lse) and backward (dq, dk, dv, d sinks) against the dense single-device float32 reference,
with the strategy tests' helpers and bounds (tests/test_attention_strategies.py: outputs 5e-5,
gradients 2e-4), every sequence layout in one compilation per case, on a context degree of 8
over two mesh axes and on data 2 x context 4. Shapes: B = 2, T = 64 (layout chunks of 4, 8 or
16 tokens), 8 query heads of 8. Then the refusals, the exchange's size (ppermutes in the jaxpr)
and its price.
"""

import dataclasses
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from lcx.attention import Mask, attention
from lcx.attention.strategies import STRATEGIES, AttentionShard, Halo
from lcx.attention.strategies.halo_pricing import halo_geometry, halo_tokens
from lcx.sharding import AttentionConfig, Plan, PlanError, bind

sys.path.insert(0, str(Path(__file__).parent))
import test_attention_lse_padding as lse_tests  # noqa: E402  (return_lse + padding checks)
import test_attention_sinks as sinks_tests  # noqa: E402  (sinks reference and checks)
import test_attention_strategies as strategies  # noqa: E402  (shared strategy-matrix helpers)

# name -> mask; registered in the strategy tests' MASKS so their cached references serve them.
# At T = 64 the layout chunks are 4 tokens (zigzag, balanced at P = 8), 8 (contiguous at P = 8;
# zigzag, balanced at P = 4) and 16 (contiguous at P = 4).
HALO_MASKS = {
    "halo_w3": Mask(window=3),  # W - 1 = 2 < every chunk
    "halo_w5_doc": Mask(document=True, window=5),  # W - 1 = 4 = the chunk at P = 8 (W > chunk)
    "halo_w9_doc": Mask(document=True, window=9),  # W - 1 = 8 = the chunk at P = 4
    "halo_c4_doc": Mask(document=True, chunk=4),  # chunked, grid moves with documents: h = 3
    "halo_c6": Mask(chunk=6),  # chunk boundaries off the layout's: h = 4 (zigzag) or 4 (contiguous)
    "halo_c8": Mask(chunk=8),  # aligned with contiguous chunks at P = 8: nothing to exchange there
}
MESHES = {  # name -> (mesh, batch rule, seq rule)
    "c8": ((("context", 2), ("ring", 4)), None, ("context", "ring")),
    "d2c4": ((("data", 2), ("context", 4)), "data", "context"),
}


@pytest.fixture(autouse=True)
def _halo_masks(monkeypatch):
    for name, mask in HALO_MASKS.items():
        monkeypatch.setitem(strategies.MASKS, name, mask)


def halo_plan(mesh_name, kernel="xla", layout="zigzag"):
    mesh, batch, seq = MESHES[mesh_name]
    plan = Plan(
        mesh=mesh,
        activations={"batch": batch, "seq": seq},
        attention=AttentionConfig(
            strategy="halo", kernel=kernel, layout=layout, block_q=strategies.BLOCK_Q, block_kv=strategies.BLOCK_KV
        ),
    )
    return bind(plan, jax.devices()[:8])


CASES = [  # mesh, mask, heads
    ("c8", "halo_w3", "gqa4"),
    ("c8", "halo_w5_doc", "mqa"),
    ("c8", "halo_c4_doc", "mha"),
    ("c8", "halo_c6", "gqa4"),
    ("c8", "halo_c8", "mqa"),
    ("d2c4", "halo_w9_doc", "gqa4"),
    ("d2c4", "halo_w3", "mha"),
]


LAYOUTS = ("contiguous", "zigzag", "balanced")


# The floor stack (-m "not slow") runs one case per mesh; the current stack all of them.
FLOOR_CASES = {("c8", "halo_w5_doc", "mqa"), ("d2c4", "halo_w9_doc", "gqa4")}


@pytest.mark.parametrize(
    "mesh_name,mask_name,heads",
    [pytest.param(*c, marks=() if c in FLOOR_CASES else pytest.mark.slow) for c in CASES],
    ids=["-".join(c) for c in CASES],
)
def test_halo_matches_reference(mesh_name, mask_name, heads):
    """Out and dq/dk/dv under each layout; the halo's rounds follow ``plan.attention.layout``,
    which must be the layout the data was laid out in (one plan, one compilation per layout)."""
    for layout in LAYOUTS:
        mp = halo_plan(mesh_name, layout=layout)
        assert isinstance(mp.plan.attention.strategy, str) and mp.plan.attention.strategy == "halo"
        strategies.check_against_reference(mp, mask_name, heads, layouts=(layout,))


@pytest.mark.parametrize(
    "mesh_name,mask_name,heads",
    [("c8", "halo_w5_doc", "gqa4"), pytest.param("d2c4", "halo_c4_doc", "mqa", marks=pytest.mark.slow)],
)
def test_halo_with_sinks_matches_reference(mesh_name, mask_name, heads):
    """Out, dq/dk/dv and d sinks, every layout."""
    for layout in LAYOUTS:
        sinks_tests.check_sinks_against_reference(halo_plan(mesh_name, layout=layout), mask_name, heads, (layout,))


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["splash", "tokamax"])
def test_halo_with_a_pallas_kernel_matches_reference(monkeypatch, kernel):
    """The halo's extended keys (own, tails, padding) through a Pallas kernel (interpret mode,
    128-token blocks), zigzag, a chunked mask with documents (tails padded to the chunk)."""
    if kernel == "tokamax":
        pytest.importorskip("tokamax")
    monkeypatch.setattr(strategies, "BLOCK_Q", 128)
    monkeypatch.setattr(strategies, "BLOCK_KV", 128)
    strategies.check_against_reference(halo_plan("d2c4", kernel=kernel), "halo_c4_doc", "gqa4", ("zigzag",))


@pytest.mark.slow
def test_halo_data_in_another_layout_than_the_plans_is_wrong():
    """The check above can fail: zigzag data under a contiguous plan fetches the wrong tails."""
    with pytest.raises(AssertionError):
        strategies.check_against_reference(halo_plan("c8", layout="contiguous"), "halo_w3", "mqa", ("zigzag",))


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_halo_return_lse_and_padding_match_reference(monkeypatch, layout):
    """``return_lse=True`` on padded packed documents (a padded tail), with sinks: out, lse and
    the gradients of both, 4 devices."""
    mask = Mask(document=True, window=7)
    monkeypatch.setitem(lse_tests.CASES, "halo", ((("context", 4),), "context", mask, True))
    plan = Plan(
        mesh=(("context", 4),),
        activations={"seq": "context"},
        attention=AttentionConfig(strategy="halo", layout=layout, block_q=8, block_kv=16),
    )
    lse_tests._check_case(bind(plan, jax.devices()[:4]), "halo", (layout,))


def test_halo_refuses_global_bidirectional_and_too_long_halos():
    mp = halo_plan("c8")
    plan, shape = mp.plan, dict(mp.mesh.shape)
    with pytest.raises(PlanError, match=r"not the global kind.*\{global: ring, sliding: halo\}"):
        Halo.check_layer(Mask(document=True), plan, shape, 64)
    with pytest.raises(PlanError, match="needs a causal mask"):
        Halo.check_layer(Mask(causal=False, window=3), plan, shape, 64)
    # zigzag at P = 8: chunks of 64 / 16 = 4 tokens; W = 6 needs 5
    with pytest.raises(PlanError, match=r"window W = 6 needs W - 1 = 5 keys .* zigzag layout chunk of 4 tokens"):
        Halo.check_layer(Mask(window=6), plan, shape, 64)
    with pytest.raises(PlanError, match=r"chunk C = 6 needs up to C - 1 = 5 keys"):
        Halo.check_layer(Mask(document=True, chunk=6), plan, shape, 64)
    Halo.check_layer(Mask(window=5), plan, shape, 64)  # W - 1 = 4 = one chunk: accepted
    # the same refusal from attention(), before anything compiles
    q, k, v, pos, seg, _ = strategies.sharded(mp, *strategies.inputs("halo_w3", "gqa4"))
    with pytest.raises(ValueError, match="window W = 6 needs W - 1 = 5"):
        jax.eval_shape(lambda *a: attention(*a[:3], plan=mp, mask=Mask(window=6), positions=a[3]), q, k, v, pos)


@pytest.mark.parametrize("layout,rounds", [("contiguous", 1), ("zigzag", 2), ("balanced", 7)])
def test_halo_sends_only_its_rounds(layout, rounds):
    """One ppermute per round and leaf (k, v, positions, segment ids) forward; the backward adds
    one per round for each of dK and dV (the reverse permutation), and there is no all-gather."""
    mp = halo_plan("c8", layout=layout)
    mask = HALO_MASKS["halo_w3"]
    args = strategies.sharded(mp, *strategies.inputs("halo_w3", "gqa4"))
    fwd = jax.make_jaxpr(lambda q, k, v, p, s: attention(q, k, v, plan=mp, mask=mask, positions=p, segment_ids=s))
    both = jax.make_jaxpr(strategies.attention_vjp_fn(mp, mask, compiler_options=None))(*args)
    assert strategies._count_primitive(fwd(*args[:5]).jaxpr, "ppermute") == 4 * rounds
    assert strategies._count_primitive(both.jaxpr, "ppermute") == 6 * rounds
    assert strategies._count_primitive(both.jaxpr, "all_gather") == 0


def test_geometry_of_each_layout():
    """Which device sends which chunk tail: the rounds, halo length and keys received."""
    w = Mask(window=3)
    g = halo_geometry(w, "contiguous", 64, 4, 16)
    assert (g.chunk_len, g.slots, g.halo, g.received, g.sent) == (16, 1, 2, 2, 2)
    assert [r.pairs for r in g.rounds] == [((0, 1), (1, 2), (2, 3))]
    g = halo_geometry(w, "zigzag", 64, 4, 16)  # device d: chunks d and 7 - d of 8
    assert [(r.src_slots, r.pairs) for r in g.rounds] == [
        ((0,), ((0, 1), (1, 2), (2, 3))),
        ((1,), ((1, 0), (2, 1), (3, 2))),
    ]
    assert g.rounds[1].receives(4) == (True, True, True, False)  # device 3's chunk 4 follows its chunk 3
    g = halo_geometry(w, "balanced", 64, 4, 16)  # 2 chunks of 8 per device, holders per row
    assert len(g.rounds) == 3 and all(r.src_slots == (0, 1) for r in g.rounds) and g.received == 3 * 2 * 2
    # chunked: no documents and aligned boundaries -> nothing; documents -> C - 1
    assert halo_geometry(Mask(chunk=8), "contiguous", 64, 8, 16).rounds == ()
    assert halo_tokens(Mask(chunk=6), 8, 64) == 4 and halo_tokens(Mask(document=True, chunk=6), 8, 64) == 5
    assert halo_geometry(w, "zigzag", 64, 1, 16).rounds == ()  # one device: local
    # a tail of h = 3 is padded on arrival to 4 keys (the least divisor of c = 16 >= 3), not sent
    g = halo_geometry(Mask(window=4), "contiguous", 64, 4, 16)
    assert (g.halo, g.piece, g.received, g.sent) == (3, 4, 4, 3)


def _shard(**kw):
    base = dict(local_batch=1, seq_len=32768, context_degree=8, ulysses_degree=1, heads=8, kv_heads=2)
    return AttentionShard(**{**base, "head_dim": 64, "act_bytes": 2, **kw})


def test_halo_price():
    """Kernel call, buffers, residuals and bytes sent, by hand: S = 32K on 8 devices (T = 4096),
    2 kv heads of 64 in bf16, W = 1024 zigzag: two rounds of 1023 tokens sent, each padded on
    arrival to 1024 keys (the least divisor of the 2048-token chunk >= 1023)."""
    s = _shard(window=1024, layout="zigzag")
    h, piece, T = 1023, 1024, 4096
    L = T + 2 * piece
    assert Halo.kernel_call(s) == (T, L, 8, 2)
    assert Halo.buffer_bytes(s, backward=False) == 2 * L * 2 * 64 * 2 + 2 * L * 4
    assert Halo.residual_bytes(s) == 2 * 2 * piece * 2 * 64 * 2 + 2 * L * 4
    kv, ids = 2 * 2 * h * 2 * 64 * 2, 2 * 2 * h * 4
    t = Halo.traffic(s, layers=3, replay=1)
    assert t.ring == 3 * ((kv + ids) * 2 + kv) and t.ring_hops == 2 * 3 * 3 and t.all_gather == 0
    assert Halo.traffic(s, layers=3, replay=0).ring == 3 * (kv + ids + kv)
    # >= 8x fewer bytes than the ring on the same layer
    ring = STRATEGIES["ring"].traffic(s, layers=3, replay=1).ring
    assert ring / t.ring > 8
    assert Halo.imbalance_degree(8, 1) == 1 and Halo.ring_hop(32768, 8, 1, 8, 2) is None
    # the new shard fields leave every other strategy's price as it was
    plain = _shard()
    for cls in (c for n, c in STRATEGIES.items() if n != "halo"):
        assert cls.traffic(plain, layers=2, replay=1) == cls.traffic(s, layers=2, replay=1)
        assert cls.kernel_call(plain) == cls.kernel_call(s)
    with pytest.raises(ValueError, match="global"):
        Halo.traffic(plain, layers=1, replay=0)
    # chunked, aligned, no documents: nothing sent; a context degree of 1 neither
    assert Halo.traffic(_shard(chunk=4096, documents=False, layout="contiguous"), layers=1, replay=0).ring == 0
    assert Halo.traffic(_shard(chunk=4096, documents=False), layers=1, replay=0).ring > 0  # zigzag: 2048 + 2048
    assert Halo.traffic(dataclasses.replace(s, context_degree=1), layers=1, replay=0).ring == 0
    assert np.isclose(t.ring_hop_bytes, (kv + ids) / 2)
