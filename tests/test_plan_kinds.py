"""Per-layer-kind strategies in the plan (issue 40, item 2): ``plan.attention.strategy`` as one
name or a mapping kind -> name, in code, YAML and Hydra overrides; each used strategy's plan
rules; routing of ``attention()`` by ``mask.kind``; and the refusal, before compile, of a model
layer kind the plan gives no strategy or whose strategy cannot run it."""

import sys
from pathlib import Path

import jax
import pytest
from hydra import compose, initialize_config_module

from lcx.attention import AllGather, Mask, Ring, Ulysses, build_strategy, check_layer_kinds
from lcx.config import run_config
from lcx.sharding import AttentionConfig, Plan, PlanError, bind
from lcx.sharding.attention_config import KindStrategies
from lcx.sharding.config import plan_from_dict, preset

sys.path.insert(0, str(Path(__file__).parent))
import test_attention_strategies as strategies  # noqa: E402  (shared strategy-matrix helpers)

PER_KIND = {"sliding": "allgather", "global": "ring"}


def _compose(*overrides):
    with initialize_config_module("lcx.conf", version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_one_name_serves_every_kind_as_today():
    a = AttentionConfig(strategy="ring")
    assert a.strategy == "ring" and a.strategy_names == ("ring",)
    assert [a.strategy_for(k) for k in ("global", "sliding", "chunked")] == ["ring"] * 3
    assert preset("ring").to_config()["attention"]["strategy"] == "ring"


def test_a_mapping_is_normalised_hashable_and_round_trips():
    a = AttentionConfig(strategy=PER_KIND)
    b = AttentionConfig(strategy={"global": "ring", "sliding": "allgather"})
    assert isinstance(a.strategy, KindStrategies) and a == b and hash(a) == hash(b)
    assert list(a.strategy) == ["global", "sliding"]  # kept in LAYER_KINDS order
    assert a.strategy_for("sliding") == "allgather" and a.strategy_for("global") == "ring"
    assert a.strategy_names == ("ring", "allgather")
    p = preset("ring", strategy=PER_KIND)
    assert "attention[{global: ring, sliding: allgather}" in repr(p)
    cfg = p.to_config()
    assert cfg["attention"]["strategy"] == {"global": "ring", "sliding": "allgather"}  # plain dict: YAML/JSON
    assert plan_from_dict(cfg) == p


@pytest.mark.parametrize(
    "strategy, match",
    [
        ({"local": "ring"}, r"unknown layer kind 'local' in plan.attention.strategy; the kinds are \('global', "),
        ({"global": "rung"}, r"plan.attention.strategy.global: unknown attention strategy 'rung'; choose one of"),
        ({}, r"plan.attention.strategy is an empty mapping"),
    ],
)
def test_bad_strategy_values_are_refused_naming_the_value_and_choices(strategy, match):
    with pytest.raises(PlanError, match=match):
        AttentionConfig(strategy=strategy)


def test_a_kind_without_strategy_is_refused_with_the_fix():
    a = AttentionConfig(strategy={"global": "ring"})
    with pytest.raises(
        PlanError, match=r"sliding layers have no strategy: add sliding: <name> to plan.attention.strategy"
    ):
        a.strategy_for("sliding")
    with pytest.raises(PlanError, match=r"unknown layer kind 'dense'"):
        a.strategy_for("dense")


def test_hydra_override_and_yaml_take_a_mapping():
    run = run_config(_compose("plan=ring", "plan.attention.strategy={global: ring, sliding: allgather}"))
    assert run.plan.attention.strategy == PER_KIND
    assert run_config(_compose("plan=ring")).plan.attention.strategy == "ring"


def test_every_used_strategy_runs_its_plan_rules_on_the_shared_mesh():
    # usp needs the ulysses and ring axes; the ring preset's mesh has a context axis only
    with pytest.raises(
        PlanError,
        match=r"strategy 'usp' needs the sequence split over exactly two mesh axes.*global layers' strategy "
        r"'usp'; the strategies of plan.attention.strategy \{global: usp, sliding: ring\} share one mesh",
    ):
        preset("ring", strategy={"global": "usp", "sliding": "ring"})
    preset("usp", strategy={"global": "usp", "sliding": "ring"})  # both run on usp's mesh
    # check_plan_dims of each: a2a's Ulysses degree 8 does not divide 4 heads, whichever kind it runs
    p = Plan(mesh={"context": 8}, activations={"seq": "context"}, attention={"strategy": {"sliding": "a2a"}})
    with pytest.raises(PlanError, match=r"must divide the 4 query heads.* \[sliding layers' strategy 'a2a'\]"):
        p.validate(8, dims={"heads": 4, "kv_heads": 4})
    with pytest.raises(PlanError, match=r"must divide the 4 query heads.*\[chunked layers' strategy 'a2a'; the "):
        p.with_attention(strategy={"global": "ring", "chunked": "a2a"}).validate(8, dims={"heads": 4, "kv_heads": 4})
    p.with_attention(strategy="ring").validate(8, dims={"heads": 4, "kv_heads": 4})


def test_attention_routes_each_mask_to_its_kinds_strategy():
    mp = strategies.make_mesh_plan({"global": "allgather", "sliding": "ring", "chunked": "a2a"}, 4)
    shapes = ((2, 64, 8, 8), (2, 64, 2, 8))
    assert type(build_strategy(mp, Mask(), *shapes)[0]) is AllGather
    assert type(build_strategy(mp, Mask(window=12), *shapes)[0]) is Ring
    assert type(build_strategy(mp, Mask(chunk=16), *shapes)[0]) is Ulysses
    only_global = bind(mp.plan.with_attention(strategy={"global": "ring"}), jax.devices()[:4])
    with pytest.raises(PlanError, match="sliding layers have no strategy"):
        build_strategy(only_global, Mask(window=12), *shapes)


def test_a_per_kind_plan_matches_the_reference_forward_and_backward():
    # the sliding layer runs on the ring, routed by its mask; against the float32 reference
    mp = strategies.make_mesh_plan({"global": "allgather", "sliding": "ring"}, 4)
    strategies.check_against_reference(mp, "window", "gqa4", layouts=("zigzag",))


def _tiny(*overrides):
    return run_config(_compose("model=tiny", "model.sliding_window=64", "plan=ring", "train.seq_len=256", *overrides))


def test_preflight_refuses_a_model_kind_the_plan_leaves_without_strategy():
    from lcx.training.preflight import resolve

    with pytest.raises(PlanError, match=r"sliding layers have no strategy: add sliding: <name>"):
        resolve(_tiny("plan.attention.strategy={global: ring}"), 8, check_memory=False)
    resolve(_tiny("plan.attention.strategy={global: ring, sliding: allgather}"), 8, check_memory=False)
    # a global model needs no sliding strategy
    resolve(
        run_config(_compose("model=tiny", "plan=ring", "plan.attention.strategy={global: ring}")), 8, check_memory=False
    )


def test_each_kind_is_asked_of_its_strategy(monkeypatch):
    """check_layer_kinds calls the kind's strategy's check_layer once per distinct mask, with the
    resolved mesh and S (a refusing check_layer stands in for a strategy that cannot run a kind)."""
    seen = []

    def refuse_wide(cls, mask, plan, mesh_shape, seq_len):
        seen.append((cls.__name__, mask, dict(mesh_shape), seq_len))
        if mask.window and mask.window > seq_len // mesh_shape["context"]:
            raise PlanError(f"{mask.kind} window {mask.window} exceeds a chunk")

    monkeypatch.setattr(Ring, "check_layer", classmethod(refuse_wide))
    plan = preset("ring", strategy={"global": "allgather", "sliding": "ring"})
    check_layer_kinds([Mask(window=16), Mask(), Mask(window=16)], plan, 8, 256)
    assert seen == [("Ring", Mask(window=16), {"data": 2, "context": 4}, 256)]
    with pytest.raises(PlanError, match="sliding window 128 exceeds a chunk"):
        check_layer_kinds([Mask(window=128)], plan, 8, 256)


def test_the_hybrid_tiny_model_under_ring_halo_and_its_refusals():
    from lcx.training.preflight import resolve

    assert preset("ring_halo").attention.strategy == {"global": "ring", "sliding": "halo", "chunked": "halo"}
    hybrid = ("model=tiny_hybrid", "train.seq_len=4096")
    resolve(run_config(_compose(*hybrid, "plan=ring_halo")), 8, check_memory=False)
    with pytest.raises(PlanError, match=r"sliding layers have no strategy: add sliding: <name>"):
        resolve(run_config(_compose(*hybrid, "plan=ring", "plan.attention.strategy={global: ring}")), 8)
    # halo runs windowed layers only: given the global layers, it refuses before compile
    with pytest.raises(PlanError, match=r"global"):
        resolve(run_config(_compose(*hybrid, "plan=ring", "plan.attention.strategy=halo")), 8, check_memory=False)
