"""The ledger and planner per layer kind (issue 40, item 4): FLOPs from each kind's visible
pairs, bytes moved by each kind's strategy over its layers, memory per kind (transients: the
largest kind's; saved residuals: summed by layer counts), the planner's strategy per kind, and
the per-kind lines of ``lcx.plan``. A uniform model prices exactly as before (tests/test_cost.py)."""

from __future__ import annotations

import dataclasses

import pytest

from lcx import cost
from lcx.attention import AllGather, Mask, Ulysses
from lcx.attention.strategies import STRATEGIES, get_strategy
from lcx.cost.flops import visible_pairs
from lcx.cost.kinds import LayerGroup, layer_groups
from lcx.cost.local import LocalStep, StepSizes
from lcx.models.presets import preset
from lcx.reports.timing import kind_lines
from lcx.sharding import PlanError
from lcx.sharding.attention_config import KindStrategies
from lcx.sharding.config import preset as plan_preset


@dataclasses.dataclass(frozen=True)
class _Kind:
    """Stand-in for lcx.models.kinds.LayerKind (its ``mask(document)``) until it lands."""

    window: int | None = None
    chunk: int | None = None

    def mask(self, document: bool) -> Mask:
        return Mask(document=document, window=self.window, chunk=self.chunk)


def _hybrid(kinds):
    """The tiny preset with one layer kind per layer (a frozen stand-in with ``layer_kinds``)."""
    base = preset("tiny")
    fields = {f: getattr(base, f) for f in ("d_model", "n_heads", "n_kv_heads", "head_dim", "mlp_dim", "vocab_size")}
    cls = dataclasses.make_dataclass(
        "Hybrid",
        [*fields, "n_layers", "layer_kinds", ("dtype", str, "float32"), ("param_dtype", str, "float32")],
        frozen=True,
    )
    return cls(**fields, n_layers=len(kinds), layer_kinds=tuple(kinds))


S, B, N_DEV = 2048, 2, 8
HW = cost.hardware_from_config({"name": "cpu", "peak_flops_per_chip": 1e12, "hbm_bytes": 2**34}, probe=False)
POLICY = cost.ActivationPolicy("none")
PER_KIND = {"global": "ring", "sliding": "allgather", "chunked": "a2a"}
# strategies that propose no mesh of their own (halo): tried on the others' meshes
PASSENGERS = {n for n, cls in STRATEGIES.items() if not cls.search_meshes(2, 4)}


@pytest.mark.parametrize("S, C", [(10, 3), (9, 3), (5, 8), (64, 16), (7, 1)])
def test_chunked_pairs_are_the_exact_count(S, C):
    causal = sum(1 for q in range(S) for k in range(q + 1) if q // C == k // C)
    full = sum(1 for q in range(S) for k in range(S) if q // C == k // C)
    assert visible_pairs(S, chunk=C) == causal and visible_pairs(S, chunk=C, causal=False) == full
    assert cost.attention_pairs(S, chunk=C) == (causal if C < S else S * S / 2)


def test_groups_of_a_hybrid_model_in_first_appearance_order():
    cfg = _hybrid([_Kind(512), _Kind(512), _Kind(), _Kind(512), _Kind(512), _Kind(), _Kind(512)])
    assert layer_groups(cfg) == (LayerGroup(Mask(window=512), 5), LayerGroup(Mask(), 2))
    with pytest.raises(ValueError, match=r"window=64, chunk=None given for a model whose layers carry"):
        layer_groups(cfg, window=64)
    tiny = preset("tiny")  # document_mask: true
    assert layer_groups(tiny, window=64) == (LayerGroup(Mask(document=True, window=64), tiny.n_layers),)


def test_one_kind_model_prices_exactly_as_the_uniform_one():
    plan = plan_preset("ring").with_mesh(data=2, context=4)
    step = StepSizes(S, B, "float32", "float32").args()
    uniform = preset("tiny")
    one_kind = _hybrid([_Kind(256)] * uniform.n_layers)
    a = cost.estimate(uniform, plan, HW, N_DEV, policy=POLICY, window=256, **step)
    b = cost.estimate(one_kind, plan, HW, N_DEV, policy=POLICY, **step)
    assert (a.flops, a.memory, a.comm, a.step_time) == (b.flops, b.memory, b.comm, b.step_time)
    assert [(k.kind, k.layers, k.strategy) for k in a.kinds] == [("sliding", uniform.n_layers, "ring")]


def test_hybrid_flops_bytes_and_memory_are_priced_per_kind():
    kinds = [_Kind(256), _Kind(256), _Kind(), _Kind(chunk=512), _Kind(256), _Kind()]
    cfg = _hybrid(kinds)
    plan = plan_preset("ring", strategy=PER_KIND).with_mesh(data=2, context=4)
    st = StepSizes(S, B, "float32", "float32")
    e = cost.estimate(cfg, plan, HW, N_DEV, policy=POLICY, **st.args())
    N, H = cfg.n_heads, cfg.head_dim
    # FLOPs: each kind's exact pairs over its layers (global: MaxText's S^2 / 2), fwd + 2 bwd
    pairs = 3 * visible_pairs(S, window=256) + 2 * S * S / 2 + 1 * visible_pairs(S, chunk=512)
    assert e.flops.attention == pytest.approx(3 * 4.0 * B * pairs * N * H, rel=1e-12)
    assert [(k.kind, k.layers, k.strategy) for k in e.kinds] == [
        ("sliding", 3, "allgather"),
        ("global", 2, "ring"),
        ("chunked", 1, "a2a"),
    ]
    # bytes: each kind's strategy's traffic over its own layers
    local = LocalStep.of(cfg, plan, N_DEV, st)
    sent = {
        name: get_strategy(name).traffic(local.kinds[i].attention, layers=n, replay=0)
        for i, (name, n) in enumerate((("allgather", 3), ("ring", 2), ("a2a", 1)))
    }
    assert e.comm.all_gather == sent["allgather"].all_gather > 0
    assert e.comm.ring == sent["ring"].ring > 0 and e.comm.all_to_all == sent["a2a"].all_to_all > 0
    assert [k.comm_bytes for k in e.kinds] == [
        sent["allgather"].all_gather,
        sent["ring"].ring,
        sent["a2a"].all_to_all,
    ]
    # memory: with remat none every layer saves its strategy's residuals (allgather: the gathered
    # K/V; a2a: the post-all-to-all k/v and, in float32, the sequence-layout output); the
    # transients are the largest kind's (allgather's gathered K/V here)
    ring_plan = plan.with_attention(strategy="ring")
    base = cost.memory_breakdown(cfg, ring_plan, N_DEV, policy=POLICY, **st.args())
    res = AllGather.residual_bytes(local.kinds[0].attention)
    a2a = Ulysses.residual_bytes(local.kinds[2].attention) + local.tokens * N * H * 4
    assert res > 0 and e.memory.activations == base.activations + 3 * res + 1 * a2a
    assert e.memory.attention > base.attention and e.memory.attention_forward > base.attention_forward
    # the step's attention time is the kinds' (each priced alone; the total shares the overlap)
    assert sum(k.time for k in e.kinds) == pytest.approx(e.time.attention + e.time.exposed_comm, rel=0.05)
    lines = kind_lines(e)
    assert len(lines) == 3 and lines[0].startswith("  sliding (window 256) x3 layers: strategy allgather")
    assert lines[2].startswith("  chunked (chunk 512) x1 layers: strategy a2a")


def test_a_hybrid_model_without_a_kinds_strategy_is_not_priced():
    cfg = _hybrid([_Kind(256), _Kind()])
    plan = plan_preset("ring", strategy={"global": "ring"}).with_mesh(data=2, context=4)
    with pytest.raises(PlanError, match="sliding layers have no strategy"):
        cost.estimate(cfg, plan, HW, N_DEV, policy=POLICY, seq_len=S, global_batch=B)


def test_the_planner_chooses_a_strategy_per_kind(monkeypatch):
    """On each strategy's mesh every choice per kind that uses it is tried, each plan once; a
    strategy whose check_layer refuses a kind (a stand-in for halo refusing global layers) is
    never given that kind."""

    def windowed_only(cls, mask, plan, mesh_shape, seq_len):
        if mask.kind == "global":
            raise PlanError("allgather (stand-in): global layers refused")

    monkeypatch.setattr(AllGather, "check_layer", classmethod(windowed_only))
    cfg = _hybrid([_Kind(256), _Kind(256), _Kind()])
    cands = cost.candidate_plans(cfg, N_DEV, S, B)
    keys = [(p.mesh, p.params, p.attention) for p, _ in cands]
    assert len(keys) == len(set(keys))  # allgather, ring and a2a share their mesh: each mixed plan once
    plans = {p.attention.strategy: p.name for p, _ in cands}
    assert plans[KindStrategies({"sliding": "allgather", "global": "ring"})] == "allgather+ring"
    assert KindStrategies({"sliding": "ring", "global": "a2a"}) in plans and "ring" in plans
    # usp's mesh: usp for the global layers, another strategy for the sliding ones
    assert KindStrategies({"sliding": "ring", "global": "usp"}) in plans
    assert all(not isinstance(s, str) or s != "allgather" for s in plans)  # never for global layers
    assert all(isinstance(s, str) or s["global"] != "allgather" for s in plans)
    # a uniform model: one strategy per mesh, as before (the stand-in only for windowed layers)
    sliding = {p.attention.strategy for p, _ in cost.candidate_plans(preset("tiny"), N_DEV, S, B, window=256)}
    assert sliding == {"allgather", "ring", "a2a", "usp", *PASSENGERS}
    assert {p.attention.strategy for p, _ in cost.candidate_plans(preset("tiny"), N_DEV, S, B)} == {
        "ring",
        "a2a",
        "usp",
    }
    rec = cost.search(cfg, HW, N_DEV, seq_len=S, global_batch=B, dtype="float32")
    assert rec.best is not None and len(rec.best.est.kinds) == 2


def _plan_report(tmp_path, *overrides):
    from hydra import compose, initialize_config_module

    from lcx.config import plan_query
    from lcx.plan import run

    with initialize_config_module("lcx.conf", version_base="1.3"):
        return run(plan_query(compose("plan_config", overrides=list(overrides))), tmp_path)


def test_lcx_plan_prints_one_line_per_kind_for_the_hybrid_tiny_model(tmp_path, capsys):
    report = _plan_report(tmp_path, "model=tiny_hybrid", "plan=ring_halo", "train.global_batch=2")
    out = capsys.readouterr().out
    assert "  per layer kind (attention only):" in out
    assert "    sliding (window 512) x4 layers: strategy halo, attention " in out
    assert "    global x2 layers: strategy ring, attention " in out
    kinds = report["given"]["estimate"]["kinds"]
    assert [(k["kind"], k["layers"], k["strategy"]) for k in kinds] == [("sliding", 4, "halo"), ("global", 2, "ring")]


def test_gemma3_like_at_128k_on_v5p_halo_saves_over_ring(tmp_path, capsys):
    """The Gemma-3-like preset (48 layers, [sliding 1,024 x5, global]) at 131,072 tokens on 16
    TPU v5p chips: the sliding layers under halo send far fewer bytes than under the ring (each
    device receives W - 1 keys per chunk instead of the whole sequence's K/V) and the predicted
    step is shorter; the global layers are priced the same either way."""
    common = ("model=gemma3_12b", "hardware=tpu_v5p", "hardware.chips=16", "train.seq_len=131072")
    ring = _plan_report(tmp_path, *common, "plan=ring_cp")["given"]["estimate"]
    halo = _plan_report(tmp_path, *common, "plan=ring_cp", "plan.attention.strategy={global: ring, sliding: halo}")[
        "given"
    ]["estimate"]
    r, h = ({k["kind"]: k for k in e["kinds"]} for e in (ring, halo))
    assert (r["sliding"]["layers"], r["global"]["layers"]) == (40, 8)
    assert r["sliding"]["strategy"] == "ring" and h["sliding"]["strategy"] == "halo"
    assert h["sliding"]["comm_bytes"] * 8 < r["sliding"]["comm_bytes"]
    assert h["sliding"]["time"] < r["sliding"]["time"] and r["global"] == h["global"]
    assert halo["step_time_s"] < ring["step_time_s"]
    assert halo["model_flops_per_step"] == ring["model_flops_per_step"]


@pytest.mark.slow  # ~1 min on the current stack; minutes on the floor's slower shape checks
def test_gemma3_27b_plan_without_chips_prices_the_smallest_fitting_slice(tmp_path, capsys):
    """The issue's command, ``python -m lcx.plan model=gemma3_27b train.seq_len=131072
    hardware=tpu_v5p``: with no ``hardware.chips`` the planner prices the smallest power-of-two
    slice on which a plan fits (lcx.reports.plan.smallest_slice tries them in order, so none
    smaller fits), and the report has a line per layer kind (62 layers: 52 sliding, 10 global)."""
    report = _plan_report(tmp_path, "model=gemma3_27b", "hardware=tpu_v5p", "train.seq_len=131072")
    err = capsys.readouterr().err
    chips = report["chips"]
    assert f"hardware.chips not set: pricing the smallest slice on which a plan fits, {chips} chips" in err
    assert report["recommendation"] is not None
    kinds = {k["kind"]: k["layers"] for k in report["given"]["estimate"]["kinds"]}
    assert kinds == {"sliding": 52, "global": 10}
