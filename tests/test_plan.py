"""The sharding plan: construction, composition, Hydra round trip, resolution, validation."""

import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from lcx.config import run_config
from lcx.config.plan import plan_from_config
from lcx.sharding import AttentionConfig, Plan, PlanError, bind, layout_permutation
from lcx.sharding.config import preset, preset_names
from lcx.sharding.layout import apply_layout, causal_work_per_device, inverse_permutation, undo_layout

RING = Plan(
    mesh=(("data", 2), ("context", -1)),
    activations={"batch": "data", "seq": "context"},
    attention=AttentionConfig(strategy="ring"),
    name="ring",
)
LLAMA_8B_DIMS = {
    "heads": 32,
    "kv_heads": 8,
    "head_dim": 128,
    "embed": 4096,
    "mlp": 14336,
    "vocab": 128256,
    "layers": 32,
}


def test_plan_is_frozen_hashable_and_normalised():
    a = Plan(mesh={"data": 2, "context": -1}, activations={"seq": ["context"], "batch": "data"})
    b = Plan(mesh=(("data", 2), ("context", -1)), activations=(("batch", "data"), ("seq", "context")))
    assert a == b and hash(a) == hash(b)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.name = "x"
    assert "seq->context" in repr(a) and "data=2" in repr(a)


def test_mesh_fill_and_size_errors():
    assert RING.mesh_shape(8) == {"data": 2, "context": 4}
    assert RING.context_degree(8) == 4
    with pytest.raises(PlanError, match="does not divide the 7"):
        RING.mesh_shape(7)
    fixed = Plan(mesh={"data": 2, "context": 2}, activations={"batch": "data"})
    with pytest.raises(PlanError, match="has 4 devices but 8 are available"):
        fixed.mesh_shape(8)
    with pytest.raises(PlanError, match="at most one mesh axis"):
        Plan(mesh={"data": -1, "context": -1})


def test_unknown_axes_are_refused():
    with pytest.raises(PlanError, match="unknown mesh axis 'contxt'"):
        Plan(mesh={"contxt": 8})
    with pytest.raises(PlanError, match="unknown logical axis 'sequence'"):
        Plan(mesh={"context": 8}, activations={"sequence": "context"})
    with pytest.raises(PlanError, match="which plan.mesh does not declare"):
        Plan(mesh={"data": 8}, activations={"seq": "context"})
    with pytest.raises(PlanError, match="unknown logical axis"):
        RING.activation_spec(("batch", "tokens"))


def test_composition_is_pure():
    p2 = RING.with_mesh(context=2, data=4)
    assert RING.mesh_shape(8) == {"data": 2, "context": 4} and p2.mesh_shape(8) == {"data": 4, "context": 2}
    p3 = RING.with_rule("embed", "data", kind="params")
    assert p3.param_rules == {"embed": ("data",)} and RING.param_rules == {}
    p4 = RING.with_attention(strategy="allgather", layout="contiguous")
    assert p4.attention.strategy == "allgather" and RING.attention.strategy == "ring"
    with pytest.raises(PlanError, match="unknown attention strategy"):
        RING.with_attention(strategy="ulysses")


@pytest.mark.parametrize("name", preset_names())
def test_presets_round_trip_through_hydra_schema(name):
    p = preset(name)
    assert plan_from_config(p.to_config()) == p
    p.mesh_shape(8)


def test_presets_cover_the_issue_list():
    assert {"dp", "fsdp", "allgather", "a2a", "ring", "usp", "fsdp_ring"} <= set(preset_names())
    with pytest.raises(PlanError, match="no plan preset 'rng'"):
        preset("rng")


def test_misspelt_key_is_an_error():
    with pytest.raises(PlanError, match="atention"):
        plan_from_config({"mesh": {"data": 8}, "atention": {"strategy": "ring"}})
    with pytest.raises(PlanError, match="stratgy"):
        plan_from_config({"mesh": {"data": 8}, "attention": {"stratgy": "ring"}})


@pytest.mark.parametrize("override", ["+plan.foo=1", "+plan.attention.blockq=256"])
def test_key_appended_with_plus_is_an_error(override):
    # Hydra lets '+' append a key to the composed (PlanSchema-typed) node; the plan must refuse it
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="lcx.conf", version_base=None):
        cfg = compose(config_name="config", overrides=["plan=ring", override])
    with pytest.raises(PlanError, match=override.split(".")[-1].split("=")[0]):
        run_config(cfg)  # what the entry points call


def test_specs_and_named_shardings(devices):
    p = preset("fsdp_ring")
    assert p.param_spec(("layers", "embed", "heads", "head_dim")) == P(None, "fsdp", None, None)
    assert p.activation_spec(("batch", "seq", "embed")) == P("fsdp", "context", None)
    usp = preset("usp")
    assert usp.activation_spec(("batch", "seq")) == P("data", ("ulysses", "ring"))
    mp = bind(p, devices)
    s = mp.activation_sharding(("batch", "seq"))
    x = jax.device_put(np.zeros((2, 16), np.float32), s)
    assert x.sharding.shard_shape(x.shape) == (1, 4)


def test_axis_used_twice_in_one_spec():
    p = Plan(mesh={"data": 2, "context": 4}, activations={"batch": "data", "seq": "data"})
    with pytest.raises(PlanError, match="mesh axis 'data' is used twice"):
        p.activation_spec(("batch", "seq"))
    with pytest.raises(PlanError, match="mesh axis 'data' is used twice"):
        p.validate(8, seq_len=64, global_batch=2)
    with pytest.raises(PlanError, match="uses a mesh axis twice"):
        Plan(mesh={"data": 2, "context": 4}, activations={"seq": ["context", "context"]}).validate(8)


@pytest.mark.parametrize(
    "dim,value,match",
    [
        ("heads", 30, "model heads=30 is not divisible by 4"),
        ("kv_heads", 6, "model kv_heads=6 is not divisible by 4"),
        ("mlp", 14338, "model mlp=14338 is not divisible by 4"),
        ("vocab", 128257, "model vocab=128257 is not divisible by 4"),
    ],
)
def test_dimension_not_divisible_by_tensor_axis(dim, value, match):
    p = Plan(
        mesh={"data": 2, "tensor": 4},
        params={"heads": "tensor", "kv_heads": "tensor", "mlp": "tensor", "vocab": "tensor"},
        activations={"batch": "data"},
    )
    dims = dict(LLAMA_8B_DIMS, **{dim: value})
    with pytest.raises(PlanError, match=match):
        p.validate(8, dims=dims)
    p.validate(8, dims=LLAMA_8B_DIMS)


def test_batch_not_divisible():
    with pytest.raises(PlanError, match="train.global_batch=3 is not divisible by 2"):
        RING.validate(8, seq_len=64, global_batch=3)


def test_seq_len_not_divisible_by_context_degree():
    p = RING.with_mesh(data=1, context=8)
    with pytest.raises(PlanError, match=r"4095 is not divisible by 16 \(= context degree 8 x 2 for the zigzag"):
        p.validate(8, seq_len=4095)
    with pytest.raises(PlanError, match="use train.seq_len=4080 or 4096"):
        p.validate(8, seq_len=4095)
    contiguous = p.with_attention(layout="contiguous")
    contiguous.validate(8, seq_len=4088)
    with pytest.raises(PlanError, match=r"not divisible by 8 \(= context degree 8\)"):
        contiguous.validate(8, seq_len=4092)


def test_a2a_head_limits():
    a2a = Plan(mesh={"context": 8}, activations={"seq": "context"}, attention=AttentionConfig(strategy="a2a"))
    a2a.validate(8, dims={"heads": 16, "kv_heads": 8})
    a2a.validate(8, dims={"heads": 16, "kv_heads": 2})  # 8 is a multiple of 2: replicate 4x
    with pytest.raises(PlanError, match="allow_kv_replication=true"):
        a2a.with_attention(allow_kv_replication=False).validate(8, dims={"heads": 16, "kv_heads": 2})
    with pytest.raises(PlanError, match="must divide the 6 KV heads per device or be a multiple"):
        Plan(mesh={"context": 4}, activations={"seq": "context"}, attention=AttentionConfig(strategy="a2a")).validate(
            4, dims={"heads": 12, "kv_heads": 6}
        )
    with pytest.raises(PlanError, match="must divide the 12 query heads"):
        a2a.validate(8, dims={"heads": 12, "kv_heads": 4})


def test_usp_needs_both_axes():
    with pytest.raises(PlanError, match="strategy 'usp' needs the sequence split over exactly two mesh axes"):
        Plan(mesh={"ulysses": 2, "ring": 4}, activations={"seq": "ring"}, attention=AttentionConfig(strategy="usp"))
    with pytest.raises(PlanError, match="missing"):
        Plan(
            mesh={"ulysses": 2, "context": 4},
            activations={"seq": ["ulysses", "context"]},
            attention=AttentionConfig(strategy="usp"),
        )
    for order in (["ulysses", "ring"], ["ring", "ulysses"]):
        p = Plan(mesh={"ulysses": 2, "ring": 4}, activations={"seq": order}, attention=AttentionConfig(strategy="usp"))
        p.validate(8, dims={"heads": 8, "kv_heads": 2}, seq_len=64)
    # Ulysses degree of USP is only the ulysses axis: 4 would not divide 2 kv heads... but 2 does
    p = Plan(
        mesh={"ulysses": 4, "ring": 2},
        activations={"seq": ["ulysses", "ring"]},
        attention=AttentionConfig(strategy="usp", allow_kv_replication=False),
    )
    with pytest.raises(PlanError, match="Ulysses degree 4"):
        p.validate(8, dims={"heads": 8, "kv_heads": 2})


# ---------------------------------------------------------------------------------------- layouts
@pytest.mark.parametrize("P_", [1, 2, 3, 4, 8])
def test_zigzag_permutation_round_trip(P_):
    S = 2 * P_ * 3
    perm = layout_permutation("zigzag", S, P_)
    assert sorted(perm.tolist()) == list(range(S))
    x = np.arange(S) * 10
    np.testing.assert_array_equal(undo_layout(apply_layout(x, "zigzag", P_), "zigzag", P_), x)
    c = S // (2 * P_)
    local = perm.reshape(P_, -1)
    for r in range(P_):  # device r holds chunks r and 2P-1-r
        np.testing.assert_array_equal(local[r], np.r_[r * c : (r + 1) * c, (2 * P_ - 1 - r) * c : (2 * P_ - r) * c])
    np.testing.assert_array_equal(inverse_permutation("zigzag", S, P_)[perm], np.arange(S))


def test_causal_load_balance_published_numbers():
    # the causal imbalance of contiguous sharding: contiguous P=4 -> 2, 6, 10, 14 half-block units (max/mean 1.75),
    # P=8 -> 1.875; zigzag pairing is exactly balanced.
    for P_, expected in ((4, 1.75), (8, 1.875)):
        S = 2 * P_ * 1024
        w = causal_work_per_device("contiguous", S, P_)
        assert abs(w.max() / w.mean() - expected) < 1e-3
        z = causal_work_per_device("zigzag", S, P_)
        assert z.max() / z.mean() == pytest.approx(1.0, abs=1e-12)
    # in units of one (chunk x chunk) block with 2P chunks of c tokens: 2, 6, 10, 14 at P=4
    c = 4096
    w = causal_work_per_device("contiguous", 8 * c, 4) / c**2
    np.testing.assert_allclose(w, [2, 6, 10, 14], rtol=1e-3)


@pytest.mark.parametrize("hardware,block", [("cpu", 512), ("tpu_v5p", 1024), ("tpu7", 2048)])
def test_attention_blocks_default_per_hardware(hardware, block):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="lcx.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"hardware={hardware}", "plan=ring"])
        explicit = compose(
            config_name="config",
            overrides=[
                f"hardware={hardware}",
                "plan=ring",
                "plan.attention.block_q=256",
                "plan.attention.block_kv_dkv=128",
            ],
        )
    p = plan_from_config(cfg.plan, default_block=cfg.hardware.attention_block)
    assert (p.attention.block_q, p.attention.block_kv) == (block, block)
    # the backward's blocks are no hardware default: null means the forward's blocks
    assert (p.attention.block_q_dkv, p.attention.block_kv_dkv) == (None, None)
    e = plan_from_config(explicit.plan, default_block=explicit.hardware.attention_block)
    assert (e.attention.block_q, e.attention.block_kv) == (256, block)
    assert (e.attention.block_q_dkv, e.attention.block_kv_dkv) == (None, 128)


def test_backward_blocks_round_trip_and_stay_null_when_null():
    """plan.attention.block_q_dkv / block_kv_dkv: set, they round-trip through the Hydra-style
    dict; null, they stay None (the forward's blocks), NOT the hardware's default block; 0 is
    refused with the key and the value named."""
    node = {
        "mesh": {"context": 8},
        "activations": {"seq": "context"},
        "attention": {"strategy": "ring", "block_q": 256, "block_q_dkv": 128, "block_kv_dkv": 64},
    }
    p = plan_from_config(node, default_block=1024)
    a = p.attention
    assert (a.block_q, a.block_kv, a.block_q_dkv, a.block_kv_dkv) == (256, 1024, 128, 64)
    assert plan_from_config(p.to_config()) == p
    n = plan_from_config({"mesh": {"context": 8}, "attention": {"block_q_dkv": None}}, default_block=1024).attention
    assert (n.block_q, n.block_kv, n.block_q_dkv, n.block_kv_dkv) == (1024, 1024, None, None)
    with pytest.raises(PlanError, match=r"plan\.attention\.block_kv_dkv must be >= 1 token.*got 0"):
        plan_from_config({"mesh": {"context": 8}, "attention": {"block_kv_dkv": 0}})
    with pytest.raises(PlanError, match=r"plan\.attention\.block_q_dkv must be >= 1 token.*got -2"):
        RING.with_attention(block_q_dkv=-2)


@pytest.mark.parametrize("hardware,kernel", [("cpu", "xla"), ("tpu_v5p", "splash"), ("tpu7", "splash")])
def test_attention_kernel_defaults_per_hardware(hardware, kernel):
    """A plan that leaves plan.attention.kernel null runs the hardware preset's kernel (splash on
    TPUs); one that names a kernel keeps it."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="lcx.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"hardware={hardware}", "plan=ring"])
        explicit = compose(
            config_name="config", overrides=[f"hardware={hardware}", "plan=ring", "plan.attention.kernel=xla"]
        )
    assert cfg.plan.attention.kernel is None
    p = plan_from_config(cfg.plan, default_kernel=cfg.hardware.attention_kernel)
    assert p.attention.kernel == kernel
    e = plan_from_config(explicit.plan, default_kernel=explicit.hardware.attention_kernel)
    assert e.attention.kernel == "xla"
    # what the entry points call: both defaults from the hardware preset
    assert run_config(cfg).plan.attention.kernel == kernel
    assert run_config(explicit).plan.attention.kernel == "xla"


# ---------------------------------------------------------------------------------------- the planner
# lcx.train runs vocabulary tiling and optimizer / parameter host offload (memory.*), so the
# planner's recommendations for MaxText's long-context cases are plans lcx.train trains.
def _hw(name: str):
    import pathlib

    from omegaconf import OmegaConf

    from lcx import cost

    conf = pathlib.Path(__file__).resolve().parent.parent / "conf"
    return cost.hardware_from_config(OmegaConf.load(conf / "hardware" / f"{name}.yaml"), probe=False)


def _longctx():
    from lcx.models.presets import preset as model_preset

    return model_preset("llama3_1_8b_longctx")


def test_missing_in_lcx_lists_only_what_lcx_train_cannot_run():
    from lcx.cost import ActivationPolicy, missing_in_lcx

    runs = [
        ActivationPolicy(
            "custom",
            decoder_layer_input="offload",
            context="offload",
            offload_optimizer=True,
            offload_params=True,
            vocab_tiling=16,
        ),
        ActivationPolicy("full", decoder_layer_input="offload", vocab_tiling=7),
        ActivationPolicy("none", offload_optimizer=True),
    ]
    assert all(missing_in_lcx(p) == [] for p in runs)
    assert missing_in_lcx(ActivationPolicy("dots_saveable", decoder_layer_input="offload")) == [
        "block-input offload under remat=dots_saveable"
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "hardware,n,seq,batch,local",
    [
        ("tpu7", 128, 14_680_064, 1, 114_688),  # experiment=longctx_14m_tpu7
        ("tpu_v5p", 64, 4_194_304, 2, 131_072),  # experiment=longctx_4m_v5p (recommended: data 2 x context 32)
    ],
)
def test_maxtext_cases_get_a_runnable_recommendation_with_tiling_and_offload(hardware, n, seq, batch, local):
    from lcx import cost
    from lcx.reports.planner import reasons

    rec = cost.search(_longctx(), _hw(hardware), n, seq_len=seq, global_batch=batch)
    b = rec.best
    assert b is not None and b.runnable_in_lcx and rec.best_runnable is b
    assert not any("lacks" in r for r in reasons(rec)), reasons(rec)
    # MaxText's recipe: vocabulary tiling 16 and the block input and attention context offloaded
    p = b.policy
    assert p.vocab_tiling == 16 and (seq // b.context_degree) % 16 == 0
    assert b.est.memory.logits < b.est.memory.layer_working  # tiled: the logits are no longer the peak
    assert (p.remat, p.decoder_layer_input, p.context) == ("custom", "offload", "offload")
    assert b.est.fits and batch * seq // n == local
    line = next(r for r in reasons(rec) if r.startswith("lcx.train trains it with: "))
    assert "memory.vocab_tiling=16" in line and "model.remat_context=offload" in line


def test_planner_prices_only_tile_counts_that_divide_the_local_sequence():
    from lcx import cost

    # 1,025,024 tokens on 128 devices: 8,008 = 8 x 7 x 11 x 13 local tokens; 16 does not divide
    # them, 14 does (the nearest divisor)
    from lcx.cost.planner import valid_tiling

    assert valid_tiling(16, 8008) == 14 and valid_tiling(15, 114_688) == 14
    assert valid_tiling(16, 114_688) == 16
    rec = cost.search(_longctx(), _hw("tpu7"), 128, seq_len=1_025_024, global_batch=1)
    tiled = [c for c in rec.candidates if c.policy.vocab_tiling > 1]
    assert tiled and all((1_025_024 // c.context_degree) % c.policy.vocab_tiling == 0 for c in tiled)
    assert {c.policy.vocab_tiling for c in tiled} == {14}


def test_train_overrides_are_what_hydra_and_lcx_train_accept():
    from hydra import compose, initialize_config_module

    from lcx import cost
    from lcx.cost.planner import train_overrides
    from lcx.training.memory import memory_policy
    from lcx.training.preflight import resolve

    pols = [
        cost.ActivationPolicy(
            "custom",
            decoder_layer_input="offload",
            context="offload",
            offload_optimizer=True,
            offload_params=True,
            vocab_tiling=16,
        ),
        cost.ActivationPolicy("full", decoder_layer_input="offload", vocab_tiling=16),
        cost.ActivationPolicy("full"),
    ]
    for pol in pols:
        ov = train_overrides(pol)
        with initialize_config_module(config_module="lcx.conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=["experiment=longctx_14m_tpu7", *ov])
        config = run_config(cfg)
        resolve(config, 128, check_memory=False)
        got = memory_policy(config.model, config.memory)
        # full with the block input offloaded is custom with everything else recomputed
        want = (
            pol
            if pol.remat == "custom" or pol.decoder_layer_input == "device"
            else dataclasses.replace(pol, remat="custom")
        )
        assert got == want, (ov, got.label, want.label)
    with pytest.raises(ValueError, match="lcx.train cannot run it"):
        train_overrides(cost.ActivationPolicy("dots_saveable", decoder_layer_input="offload"))


@pytest.mark.slow
def test_planner_names_the_best_plan_lcx_runs_and_it_is_the_recommendation():
    # 1M tokens x 4 on 64 v5p: the recommendation tiles the vocabulary, which lcx.train now runs
    from lcx import cost
    from lcx.reports.planner import reasons

    rec = cost.search(_longctx(), _hw("tpu_v5p"), 64, seq_len=1 << 20, global_batch=4)
    assert rec.best.runnable_in_lcx and rec.best_runnable is rec.best and rec.best.policy.vocab_tiling == 16
    assert not any("lacks" in r for r in reasons(rec))


def test_planner_warns_without_a_margin_and_needs_nothing_lcx_train_lacks():
    # ~31.9M tokens on 64 TPU7 chips: the recommendation is within 5% of the HBM (the warning);
    # it and the warning's alternatives are plans lcx.train runs
    from lcx import cost
    from lcx.reports.planner import reasons

    rec = cost.search(_longctx(), _hw("tpu7"), 128, seq_len=31_932_416, global_batch=1)
    assert 0.95 * _hw("tpu7").hbm_bytes < rec.best.est.memory.total <= _hw("tpu7").hbm_bytes
    line = next(r for r in reasons(rec) if r.startswith("warning: "))
    assert "of the 96.00 GiB of HBM (less than a 5% margin)" in line and "heap packing loss" in line
    assert rec.best.runnable_in_lcx and not any("lacks" in r for r in reasons(rec))


@pytest.mark.slow
def test_planner_hints_need_nothing_lcx_train_lacks():
    # 70B at 1M tokens on 8 v5p chips: nothing fits; the "more chips" hint is a plan lcx.train runs
    import pathlib

    from hydra import compose, initialize_config_dir

    from lcx.config import plan_query
    from lcx.plan import run

    conf = pathlib.Path(__file__).resolve().parent.parent / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        c = compose(
            "plan_config",
            overrides=["hardware=tpu_v5p", "model=llama3_70b", "hardware.chips=8", "train.seq_len=1048576"],
        )
    rec = run(plan_query(c))
    assert rec["recommendation"] is None
    hint = next(r for r in rec["reasons"] if r.startswith("nothing fits"))
    assert "x the chips (hardware.chips=" in hint and "lacks" not in hint
    assert not any(r.startswith("a plan lcx.train runs today fits with") for r in rec["reasons"])


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["longctx_14m_tpu7", "longctx_4m_v5p"])
def test_maxtext_comparison_prices_the_recipe_itself(experiment, tmp_path, capsys):
    """Like with like: the ledger line beside MaxText's measured step is the recipe's own mesh and
    policy (tiling, offloads, remat placements): for the recipe experiments, the given plan."""
    import pathlib

    from hydra import compose, initialize_config_dir

    from lcx.config import plan_query
    from lcx.plan import run

    conf = pathlib.Path(__file__).resolve().parent.parent / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        c = compose("plan_config", overrides=[f"experiment={experiment}"])
    report = run(plan_query(c), tmp_path)
    out = capsys.readouterr().out
    given = report["given"]["estimate"]
    line = next(x for x in out.splitlines() if "The ledger on that same run" in x)
    assert f"roofline {given['roofline_step_time_s']:,.1f} s/step" in line
    assert f"{given['memory_bytes_per_device']['total'] / 2**30:,.2f} GiB HBM" in line and "fits" in line
    pub = c.published.step_time_s
    assert f"measured / roofline = {pub / given['roofline_step_time_s']:.2f}" in line
    # the calibrated time model prices the same step and says how far it is from the measured one
    assert given["calibrated"] and given["step_time_s"] > given["roofline_step_time_s"]
    off = 100 * (given["step_time_s"] / pub - 1)
    assert (
        f"at the calibrated rates {given['step_time_s']:,.1f} s/step" in line
        and f"{off:+.1f}% from the measured" in line
    )
    assert report["recommendation"]["runnable_in_lcx"] and "lacks" not in out
    rec_line = next(x for x in out.splitlines() if x.strip().startswith("lcx recommends "))
    assert ("the same policy" in rec_line) == (report["recommendation"]["policy"] == report["given"]["policy"])


@pytest.mark.parametrize(
    "override,differs",
    [
        (None, None),
        ("plan.attention.kernel=tokamax", "kernel tokamax, not splash"),
        ("memory.vocab_tiling=8", "vt8, not custom"),
        ("train.seq_len=2097152", "at 2,097,152 tokens x 2, not 64 at 4,194,304 x 2"),
    ],
)
def test_the_published_step_is_compared_only_with_the_recipe_it_measured(override, differs, tmp_path, capsys):
    """An override that changes the experiment's recipe (kernel, policy, length) makes its
    published step another run's: the planner says so instead of printing an error against it,
    and the MaxText paragraph still prices the recipe itself (its splash kernel)."""
    import pathlib

    from hydra import compose, initialize_config_dir

    from lcx.config import plan_query
    from lcx.plan import run

    conf = pathlib.Path(__file__).resolve().parent.parent / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        c = compose("plan_config", overrides=["experiment=longctx_4m_v5p", *([override] if override else [])])
    run(plan_query(c), tmp_path)
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith("published"))
    if differs is None:
        assert "this plan and policy" in line and "from the published step" in line
    else:
        assert "but this run is not that one" in line and differs in line and "from the published" not in line
    same_run = next(x for x in out.splitlines() if "The ledger on that same run" in x)
    assert "46.38 GiB HBM" in same_run or override == "train.seq_len=2097152"
