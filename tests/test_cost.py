"""The cost ledger against published numbers (Llama 3 70B figures; MaxText tpu-recipes).

Pure arithmetic: no test here compiles anything (the compiled-memory comparison is
experiments/ledger_vs_compiled.py).
"""

from __future__ import annotations

import math
import os
import pathlib
from dataclasses import replace as dataclasses_replace

import pytest
from omegaconf import OmegaConf

from lcx import cost
from lcx.attention.strategies import AttentionShard
from lcx.models.presets import preset
from lcx.reports.candidates import table
from lcx.reports.planner import reasons
from lcx.sharding import causal_work_per_device
from lcx.sharding.config import preset as plan_preset

CONF = pathlib.Path(__file__).resolve().parent.parent / "conf"
GiB = 2**30


def hw(name: str, *, calibrated: bool = False):
    """The preset; its roofline only unless ``calibrated`` (these tests check the roofline's
    arithmetic; tests/test_timing.py checks the time models)."""
    h = cost.hardware_from_config(OmegaConf.load(CONF / "hardware" / f"{name}.yaml"), probe=False)
    return h if calibrated else dataclasses_replace(h, time_model=None)


# ------------------------------------------------------------------ published figures (Llama 3 70B)
def test_llama3_70b_parameters_per_layer_and_crossover():
    cfg = preset("llama3_70b")
    assert cfg.params_per_layer == 855_638_016 == 12.75 * cfg.d_model**2
    assert cost.crossover_tokens(cfg.d_model, cfg.params_per_layer) == 104_448


def test_llama3_70b_prefill_flops():
    cfg = preset("llama3_70b")
    d, P, L = cfg.d_model, cfg.params_per_layer, cfg.n_layers
    lin, quad = cost.prefill_flops_per_layer(d, P, 8192)
    assert lin == 25.5 * 8192 * d**2 and quad == 2 * 8192**2 * d
    assert f"{L * lin:.2e}" == "1.12e+15" and f"{L * quad:.2e}" == "8.80e+13"
    assert round(100 * quad / lin, 1) == 7.8  # quadratic term relative to the linear one
    lin, quad = cost.prefill_flops_per_layer(d, P, 10**6)
    assert f"{L * lin:.2e}" == "1.37e+17" and f"{L * quad:.2e}" == "1.31e+18"
    assert round(L * quad / 990e12) == 1324  # seconds on one 990 TFLOP/s H100
    # the ledger's linear count of the blocks is the same 2 n P_layer per layer
    assert cost.linear_weights_per_token(cfg) == L * P + d * cfg.vocab_size


def test_kv_cache_bytes():
    cfg = preset("llama3_70b")
    per_tok = cost.kv_cache_bytes_per_token(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, 2)
    assert per_tok == 327_680 and per_tok / 2**20 == 0.3125
    assert per_tok * 4096 / GiB == 1.25
    assert per_tok * 131_072 / GiB == 40
    assert round(per_tok * 10**6 / GiB) == 305
    mha = cost.kv_cache_bytes_per_token(cfg.n_layers, cfg.n_heads, cfg.head_dim, 2)
    assert mha / 2**20 == 2.5 and round(mha * 10**6 / 2**40, 2) == 2.38


@pytest.mark.parametrize(
    "bandwidth, gqa, expected", [(450e9, False, 2200), (50e9, False, 19800), (450e9, True, 275), (50e9, True, 2475)]
)
def test_ring_overlap_thresholds(bandwidth, gqa, expected):
    cfg = preset("llama3_70b")
    kv = cfg.n_kv_heads if gqa else cfg.n_heads
    c = cost.ring_overlap_min_block(990e12, bandwidth, n_heads=cfg.n_heads, n_kv_heads=kv, bytes_per_element=2)
    assert round(c) == expected


def test_causal_imbalance():
    assert cost.causal_half_block_work("contiguous", 4) == [2, 6, 10, 14]
    assert cost.causal_imbalance("contiguous", 4) == 1.75
    assert cost.causal_imbalance("contiguous", 8) == 1.875
    assert cost.causal_half_block_work("zigzag", 4) == [8] * 4  # exactly 2P each
    assert cost.causal_imbalance("zigzag", 8) == 1.0
    # token-exact counts (lcx.sharding) approach the half-block ratio as blocks grow
    for P in (4, 8):
        w = causal_work_per_device("contiguous", 2 * P * 512, P)
        assert abs(w.max() / w.mean() - cost.causal_imbalance("contiguous", P)) < 1e-3
        z = causal_work_per_device("zigzag", 2 * P * 512, P)
        assert z.max() == z.min()


# ------------------------------------------------------------------ MaxText MFU from published step times
@pytest.mark.parametrize(
    "hardware, seq_len, batch, devices, step_time, tflops, mfu_pct",
    [
        # tpu-recipes training/v5p/Llama3.1-8B-LongContext-Maxtext/cluster_toolkit/README.md
        ("tpu_v5p", 4_194_304, 2, 64, 1373.73, 319.0, 69.50),
        ("tpu_v5p", 14_680_064, 1, 64, 15623.09, 170.2, 37.07),
        # tpu-recipes training/ironwood/Llama3.1-8B-LongContext-Maxtext/cluster_toolkit/README.md
        ("tpu7", 14_680_064, 1, 128, 2361.05, 563.0, 48.81),
    ],
)
def test_maxtext_mfu_from_step_times(hardware, seq_len, batch, devices, step_time, tflops, mfu_pct):
    cfg = preset("llama3_1_8b_longctx")
    h = hw(hardware)
    f = cost.training_flops(cfg, seq_len, batch)
    assert round(f.total / devices / step_time / 1e12, 1) == tflops
    assert round(100 * cost.mfu(f.total, step_time, h.peak_flops_per_device, devices), 2) == mfu_pct
    assert f.attention_fraction >= 0.95
    m = cost.step_metrics(cfg, seq_len, batch, step_time, h, devices)
    assert (
        m["tokens_per_sec"] == seq_len * batch / step_time
        and m["mfu"] == f.total / step_time / devices / h.peak_flops_per_device
    )


def test_flops_components_from_layer_shapes():
    cfg = preset("tiny")
    D, N, K, H, F, V, L = 128, 4, 1, 32, 384, 256, 2
    f = cost.forward_flops(cfg, 64, 3)
    assert f.linear == 2 * 64 * 3 * (L * (D * (N + 2 * K) * H + N * H * D + 3 * D * F) + D * V)
    assert f.attention == 4 * 3 * (64 * 64 / 2) * N * H * L
    t = cost.training_flops(cfg, 64, 3)
    assert t.linear == 3 * f.linear and t.attention == 3 * f.attention
    # sliding window and documents reduce the attention count
    assert cost.attention_pairs(64, window=8) == cost.visible_pairs(64, window=8) == 8 * 9 // 2 + 56 * 8
    assert cost.attention_pairs(64, documents=[32, 32]) == 2 * 32 * 32 / 2
    with pytest.raises(ValueError):
        cost.attention_pairs(64, documents=[10, 10])
    # remat: full replays the blocks' forward (not the head); none replays nothing
    assert cost.recompute_flops(cfg, 64, 3, "none") == 0
    assert cost.recompute_flops(cfg, 64, 3, "full") == f.linear - 2 * 64 * 3 * D * V + f.attention
    assert cost.recompute_flops(cfg, 64, 3, "custom", keep_context=True) == f.linear - 2 * 64 * 3 * D * V


def test_vocab_tiling_replays_the_head_once_as_recompute_not_model_flops():
    # the tiled loss checkpoints its scan body with nothing saved: the backward recomputes each
    # tile's logits, one more h @ head (2 S B D V); untiled, nothing is replayed
    from lcx.cost.flops import head_replay_flops

    cfg = preset("tiny")
    D, V, S, B = cfg.d_model, cfg.vocab_size, 64, 3
    for remat in ("none", "full", "custom"):
        base = cost.recompute_flops(cfg, S, B, remat)
        assert cost.recompute_flops(cfg, S, B, remat, vocab_tiling=1) == base
        assert cost.recompute_flops(cfg, S, B, remat, vocab_tiling=4) == base + 2 * S * B * D * V
        assert cost.recompute_flops(cfg, S, B, remat, vocab_tiling=16) == base + 2 * S * B * D * V
    assert head_replay_flops(cfg, S, B, 1) == 0 and head_replay_flops(cfg, S, B, 8) == 2 * S * B * D * V
    with pytest.raises(ValueError):
        head_replay_flops(cfg, S, B, 0)
    # the estimate's recompute and compute time carry it; the model FLOPs (MFU numerator) do not
    plan = plan_preset("ring").with_mesh(data=1, context=8)
    kw = dict(seq_len=4096, global_batch=1)
    e1 = cost.estimate(cfg, plan, hw("tpu7"), 8, policy=cost.ActivationPolicy("full"), **kw)
    e16 = cost.estimate(cfg, plan, hw("tpu7"), 8, policy=cost.ActivationPolicy("full", vocab_tiling=16), **kw)
    assert e16.flops == e1.flops
    assert e16.recompute_flops - e1.recompute_flops == 2 * 4096 * D * V
    assert e16.compute_time - e1.compute_time == pytest.approx(2 * 4096 * D * V / 8 / hw("tpu7").peak_flops_per_device)


def test_logits_phase_of_vocab_tiling():
    # four float32 [b, T / N, V] tiles (replayed logits, the target pick's cotangent, d logits and
    # its transposed copy), the gathered head [D, V] and the final norm's residuals, h and dh
    from lcx.cost.memory import logits_phase_bytes

    cfg = preset("tiny").replace(vocab_size=4096)
    D, V = cfg.d_model, cfg.vocab_size
    tok = 256
    for n in (1, 4, 16):
        assert logits_phase_bytes(cfg, tokens=tok, vocab_tiling=n, dtype="float32") == (
            4 * 4 * (tok // n) * V + D * V * 4 + tok * (8 * D + 2 * D * 4)
        )
    assert logits_phase_bytes(cfg, tokens=tok, vocab_tiling=4, head_copy=False, dtype="bfloat16") == (
        4 * 4 * 64 * V + tok * (8 * D + 2 * D * 2)
    )
    with pytest.raises(ValueError):
        cost.ActivationPolicy("full", vocab_tiling=0)
    # memory_breakdown: the head is all-gathered when ZeRO-3 shards it, not when it is replicated
    plan = plan_preset("ring").with_mesh(data=1, context=8)
    zero3 = plan.with_rule("embed", ("data", "context"), kind="params")
    kw = dict(
        seq_len=2048,
        global_batch=1,
        policy=cost.ActivationPolicy("full", vocab_tiling=4),
        dtype="float32",
        param_dtype="float32",
    )
    assert cost.memory_breakdown(cfg, zero3, 8, **kw).logits == logits_phase_bytes(
        cfg, tokens=tok, vocab_tiling=4, dtype="float32"
    )
    assert cost.memory_breakdown(cfg, plan, 8, **kw).logits == logits_phase_bytes(
        cfg, tokens=tok, vocab_tiling=4, head_copy=False, dtype="float32"
    )


def test_state_offload_as_lcx_train_compiles_it():
    # lcx.training.step: offloaded parameters are copied to the device at the step's start and
    # held there; the offloaded optimizer state is on device for the update only (its own phase)
    cfg = preset("llama3_1_8b_longctx")
    plan = plan_preset("ring").with_mesh(data=1, context=64).with_rule("embed", ("data", "context"), kind="params")
    kw = dict(seq_len=65536, global_batch=1)
    pol = cost.ActivationPolicy("custom", decoder_layer_input="offload", context="offload")
    base = cost.memory_breakdown(cfg, plan, 64, policy=pol, **kw)
    p = base.grads
    acts_host = base.host
    both = dataclasses_replace(pol, offload_optimizer=True, offload_params=True)
    m = cost.memory_breakdown(cfg, plan, 64, policy=both, **kw)
    assert (m.params, m.grads, m.optimizer, m.update) == (p, p, 0, 2 * p)
    assert m.host == acts_host + p + 2 * p
    assert m.total == m.state + max(m.activations + m.working, m.update) == base.total - 2 * p
    # replicated parameters and a short sequence: the moments' copy (2 x 32 GiB) exceeds the
    # backward's bytes, and the update phase is the peak
    small = cost.memory_breakdown(
        cfg, plan_preset("ring").with_mesh(data=1, context=64), 64, policy=both, seq_len=4096, global_batch=1
    )
    assert small.update > small.activations + small.working and small.total == small.state + small.update
    # XLA:CPU strips memory placements: pinned_host arguments are read in place (no device copy)
    # and the offloaded residuals stay ordinary temporaries
    cpu = cost.memory_breakdown(cfg, plan, 64, policy=both, memory_kinds=False, **kw)
    assert (cpu.params, cpu.optimizer, cpu.update) == (0, 0, 0)
    assert cpu.host == p + 2 * p and cpu.activations == base.activations + acts_host
    assert cost.memory_breakdown(cfg, plan, 64, policy=pol, memory_kinds=False, **kw).total == base.total + acts_host


# ------------------------------------------------------------------ memory and communication
def test_param_bytes_follow_plan_sharding():
    cfg = preset("llama3_1_8b")
    total = cfg.n_params * 4
    assert sum(a.shape and math.prod(a.shape) * a.itemsize for a in cost.param_arrays(cfg)) == total
    dp = plan_preset("dp")
    fsdp = plan_preset("fsdp")
    from lcx.cost.memory import param_bytes_per_device

    assert param_bytes_per_device(dp, 8, cfg) == total
    # every weight has an embed axis except the norms' layer axis... all are split 8 ways
    assert param_bytes_per_device(fsdp, 8, cfg) == total // 8


def test_param_arrays_match_the_abstract_model():
    import equinox as eqx
    import jax

    from lcx.models import init_model, logical_axes

    cfg = preset("tiny")
    abstract = eqx.filter_eval_shape(init_model, cfg, key=jax.random.key(0))
    leaves = [l for l in jax.tree_util.tree_leaves(abstract) if hasattr(l, "shape")]
    axes = jax.tree_util.tree_leaves(logical_axes(abstract), is_leaf=lambda x: isinstance(x, tuple))
    got = sorted((tuple(l.shape), tuple(a)) for l, a in zip(leaves, axes))
    want = sorted((a.shape, a.axes) for a in cost.param_arrays(cfg))
    assert got == want


def test_memory_breakdown_policies_and_offload():
    cfg = preset("llama3_1_8b_longctx")
    plan = plan_preset("ring").with_mesh(data=1, context=64).with_rule("embed", ("data", "context"), kind="params")
    kw = dict(seq_len=4_194_304, global_batch=1)
    full = cost.memory_breakdown(cfg, plan, 64, policy=cost.ActivationPolicy("full"), **kw)
    T = 4_194_304 // 64
    assert full.activations == cfg.n_layers * T * cfg.d_model * 2  # block inputs in bf16
    off = cost.memory_breakdown(
        cfg, plan, 64, policy=cost.ActivationPolicy("full", decoder_layer_input="offload"), **kw
    )
    assert off.activations == 0 and off.host == full.activations
    none = cost.memory_breakdown(cfg, plan, 64, policy=cost.ActivationPolicy("none"), **kw)
    assert none.activations > full.activations
    opt = cost.memory_breakdown(cfg, plan, 64, policy=cost.ActivationPolicy("full", offload_optimizer=True), **kw)
    assert opt.optimizer == 0 and opt.host == 2 * full.params
    assert full.params == full.grads == full.optimizer // 2 == cfg.n_params * 4 // 64


def test_attention_working_memory_ordering():
    cfg = preset("llama3_1_8b_longctx")
    s = AttentionShard.from_model(cfg, seq_len=1 << 20, local_batch=1, context_degree=16)
    ag = cost.attention_working_bytes("allgather", "splash", s)
    ring = cost.attention_working_bytes("ring", "splash", s)
    a2a = cost.attention_working_bytes("a2a", "splash", s)
    assert ring < ag and ring < a2a  # ring is O(S/P), all-gather and Ulysses hold O(S) per device


def test_local_step_is_one_devices_share_and_step_defaults_are_stated_once():
    cfg = preset("llama3_1_8b_longctx")
    plan = plan_preset("ring").with_mesh(data=2, context=8)
    local = cost.LocalStep.of(cfg, plan, 16, cost.StepSizes(seq_len=1 << 20, global_batch=4))
    assert (local.context_degree, local.local_batch, local.tensor_degree) == (8, 2, 1)
    assert local.tokens == 2 * (1 << 20) // 8 and local.attention.act_bytes == 2
    assert local.attention == AttentionShard.from_model(cfg, seq_len=1 << 20, local_batch=2, context_degree=8)
    kw = dict(seq_len=4096, global_batch=4, policy=cost.ActivationPolicy("full"))
    spelt = dict(dtype="bfloat16", param_dtype="float32", tie_embeddings=False)
    assert cost.memory_breakdown(cfg, plan, 16, **kw) == cost.memory_breakdown(cfg, plan, 16, **kw, **spelt)
    assert cost.comm_bytes(cfg, plan, 16, **kw) == cost.comm_bytes(cfg, plan, 16, **kw, **spelt)


def test_comm_bytes_per_strategy():
    cfg = preset("llama3_1_8b_longctx")
    S, P, L, K, H = 1 << 20, 16, 32, 4, 256
    pol = cost.ActivationPolicy("custom", context="device")  # attention not replayed
    ring = plan_preset("ring").with_mesh(data=1, context=P)
    c = cost.comm_bytes(cfg, ring, P, seq_len=S, global_batch=1, policy=pol)
    hop = 2 * (S // P) * K * H * 2
    assert c.ring_hop_bytes == hop
    assert c.ring == L * (hop * (P - 1) * 2 + P * hop * 2)  # fwd + bwd K/V hops, bwd f32 dK/dV hops
    ag = plan_preset("allgather").with_mesh(data=1, context=P)
    c = cost.comm_bytes(cfg, ag, P, seq_len=S, global_batch=1, policy=pol)
    assert c.all_gather == 2 * S * K * H * 2 * (P - 1) / P * L * 2
    # replicated parameters: one gradient all-reduce over all devices
    assert c.grad_reduction == 2 * cfg.n_params * 4 * (P - 1) / P


# ------------------------------------------------------------------ hardware presets and flags
def test_hardware_presets():
    v5p, t7 = hw("tpu_v5p"), hw("tpu7")
    assert v5p.peak_flops_per_device == 459e12 and t7.peak_flops_per_device == 1153.5e12
    assert t7.devices_per_chip == 2 and t7.hbm_bytes == 96 * GiB and v5p.hbm_bytes == 95 * GiB
    assert v5p.link_bandwidth == 100e9 and t7.collective_bandwidth_per_device == 300e9
    for h in (v5p, t7):
        names = {f.split("=")[0] for f in h.libtpu_init_args}
        assert {
            "--xla_enable_async_collective_permute",
            "--xla_enable_async_all_gather",
            "--xla_tpu_overlap_compute_collective_tc",
            "--xla_tpu_scoped_vmem_limit_kib",
        } <= names
    for name in ("tpu_v5p", "tpu7", "cpu"):
        assert "chips" in OmegaConf.load(CONF / "hardware" / f"{name}.yaml")


def test_apply_hardware_flags_keeps_user_flags():
    env = {"LIBTPU_INIT_ARGS": "--xla_tpu_scoped_vmem_limit_kib=1234"}
    node = OmegaConf.load(CONF / "hardware" / "tpu7.yaml")
    changed = cost.apply_hardware_flags(node, env)
    assert "--xla_tpu_scoped_vmem_limit_kib=1234" in env["LIBTPU_INIT_ARGS"]
    assert "98304" not in env["LIBTPU_INIT_ARGS"] and "--xla_enable_async_all_gather=true" in env["LIBTPU_INIT_ARGS"]
    assert set(changed) == {"LIBTPU_INIT_ARGS"}
    assert cost.apply_hardware_flags(OmegaConf.load(CONF / "hardware" / "cpu.yaml"), {}) == {}
    assert os.environ.get("LIBTPU_INIT_ARGS", "").find("98304") == -1  # os.environ untouched


# ------------------------------------------------------------------ planner
def test_planner_14m_tpu7_recommends_ring_at_128():
    cfg = preset("llama3_1_8b_longctx")
    rec = cost.search(cfg, hw("tpu7"), 128, seq_len=14_680_064, global_batch=1)
    assert rec.best is not None and rec.best.context_degree == 128
    assert rec.best.plan.attention.strategy == "ring" and rec.best.est.overlap
    assert all(not c.est.fits for c in rec.candidates if c.plan.attention.strategy == "allgather")
    assert "ring" in table(rec)


@pytest.mark.slow
def test_planner_smallest_degree_with_batch():
    # 4 sequences of 1M on 64 v5p chips: data parallelism absorbs devices while memory allows
    cfg = preset("llama3_1_8b_longctx")
    rec = cost.search(cfg, hw("tpu_v5p"), 64, seq_len=1 << 20, global_batch=4)
    degrees = {c.context_degree for c in rec.candidates}
    assert degrees == {16, 32, 64}
    fit = [c.context_degree for c in rec.candidates if c.est.fits]
    assert rec.best.context_degree == min(fit)


def test_plan_entry_point(tmp_path):
    from hydra import compose, initialize_config_dir

    from lcx.config import plan_query
    from lcx.plan import run

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        c = compose(
            "plan_config",
            overrides=["model=llama3_70b", "hardware=tpu_v5p", "hardware.chips=64", "train.seq_len=131072"],
        )
        report = run(plan_query(c), tmp_path)
        assert (tmp_path / "plan.json").exists() and report["n_devices"] == 64
        c = compose("plan_config", overrides=["experiment=longctx_14m_tpu7"])
        report = run(plan_query(c), tmp_path)
        assert report["given"]["estimate"]["fits"] and report["seq_len"] == 14_680_064
    # 70B KV per token
    cfg = preset("llama3_70b")
    assert cost.kv_cache_bytes_per_token(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim) == 327_680


@pytest.mark.parametrize(
    "override,match",
    [
        ("hardware.chips=-8", r"hardware.chips=-8: must be >= 1"),
        ("hardware.chips=64.5", r"hardware.chips=64.5: must be a whole number"),
        ("train.global_batch=0", r"train.global_batch=0: must be >= 1"),
        ("train.seq_len=-5", r"train.seq_len=-5: must be >= 1"),
        ("planner.rows=everything", r"planner.rows='everything': use best .* or all"),
        # tpu_v5p runs splash, which lcx.train refuses blocks of other than multiples of 128: so does lcx.plan
        (
            "plan.attention.block_q_dkv=100",
            r"kernel='splash' needs plan.attention.block_q_dkv to be a positive multiple "
            r"of 128 tokens .* got 100",
        ),
    ],
)
def test_plan_entry_point_refuses_impossible_values(tmp_path, override, match):
    from hydra import compose, initialize_config_dir

    from lcx.config import plan_query
    from lcx.plan import run

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        c = compose(
            "plan_config",
            overrides=["model=llama3_70b", "hardware=tpu_v5p", "hardware.chips=64", "train.seq_len=131072", override],
        )
    with pytest.raises(ValueError, match=match):
        run(plan_query(c), tmp_path)
    assert not (tmp_path / "plan.json").exists()  # refused before anything is priced or written


@pytest.mark.parametrize(
    "overrides,match",
    [
        (
            ["hardware.chips=3"],
            r"no plan applies to 4,096 tokens x 1 sequence on 3 chips = 3 devices: P=3: 4,096 tokens "
            r"is not a multiple of P=3 \(contiguous layout\) nor of 2P=6 \(zigzag\).*use "
            r"hardware.chips=2 or 4, or train.seq_len=4092 or 4098",
        ),
        (
            ["train.seq_len=4100"],
            r"P=8: 4,100 tokens .*use hardware.cpu_devices=5 or 10, or train.seq_len=4096 or 4112",
        ),
        (
            ["model=llama3_1_8b_longctx", "hardware=tpu7", "hardware.chips=3", "train.seq_len=131072"],
            r"on 3 chips = 6 devices: P=6: .*nor of 2P=12.*use hardware.chips=2 or 4, or train.seq_len=131064 or 131076",
        ),
    ],
)
def test_plan_entry_point_says_why_no_candidate_exists(tmp_path, overrides, match):
    # it printed an empty table and a blank recommendation, exited 0 and wrote recommendation: null
    from hydra import compose, initialize_config_dir

    from lcx.config import plan_query
    from lcx.plan import run
    from lcx.sharding import PlanError

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        c = compose("plan_config", overrides=overrides)
    with pytest.raises(PlanError, match=match):
        run(plan_query(c), tmp_path)
    assert not (tmp_path / "plan.json").exists()


def test_plan_on_cpu_judges_fit_against_the_shared_host_ram(tmp_path, capsys, monkeypatch):
    # hardware=cpu has no HBM: the planner said an 8B model at 64K tokens "fits", lcx.train refused it
    from hydra import compose, initialize_config_dir

    import lcx.cost
    from lcx.config import plan_query
    from lcx.plan import run

    monkeypatch.setattr(lcx.cost, "host_memory_available", lambda: (16 * GiB, "test"))
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        c = compose("plan_config", overrides=["model=llama3_1_8b", "train.seq_len=65536"])
    report = run(plan_query(c), tmp_path)
    out = capsys.readouterr().out
    assert "memory: 16.00 GiB of host RAM available (test), shared by the 8 simulated devices: 2.00 GiB each" in out
    assert report["recommendation"] is None and not report["given"]["estimate"]["fits"]
    assert "against 2.00 GiB of host RAM per simulated device" in out and "x the chips" not in out
    # the tiny default fits, and its header counts its parameters in a unit that shows them
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        report = run(plan_query(compose("plan_config")), tmp_path)
    assert report["recommendation"] is not None
    assert "lcx.plan: tiny (443K parameters)" in capsys.readouterr().out


# ------------------------------------------------------------------ host transfers, lcx-runnable plans
def test_host_transfer_bytes_and_time():
    # offloaded activations go out in the forward and back in the backward; offloaded optimizer
    # state in and out at the update; offloaded parameters in for the forward and the backward,
    # out after the update
    cfg = preset("llama3_1_8b_longctx")
    t7 = hw("tpu7")
    assert t7.host_bandwidth_per_chip == 32e9 and t7.host_bandwidth_per_device == 16e9
    assert hw("tpu_v5p").host_bandwidth_per_device == 15e9 and hw("cpu").host_bandwidth_per_device is None
    plan = plan_preset("ring").with_mesh(data=1, context=128).with_rule("embed", ("data", "context"), kind="params")
    kw = dict(seq_len=1 << 20, global_batch=1)
    pol = cost.ActivationPolicy("full", decoder_layer_input="offload")
    e = cost.estimate(cfg, plan, t7, 128, policy=pol, **kw)
    acts = cfg.n_layers * (1 << 20) // 128 * cfg.d_model * 2
    assert e.memory.host == acts and e.host_bytes == 2 * acts
    assert e.host_time == 2 * acts / 16e9
    assert e.exposed_host_time == max(0.0, e.host_time - e.compute_time)
    assert e.step_time == e.compute_time + e.exposed_comm_time + e.exposed_host_time
    state = cost.ActivationPolicy("full", offload_optimizer=True, offload_params=True)
    e = cost.estimate(cfg, plan, t7, 128, policy=state, **kw)
    p = e.memory.grads
    # lcx.training.step: parameters in once at the step's start (the device copy serves the
    # forward, backward and update) and out once; AdamW's two moments in for the update and out
    assert e.host_bytes == 2 * p + 2 * 2 * p
    assert (
        cost.estimate(cfg, plan, t7, 128, policy=cost.ActivationPolicy("full", offload_params=True), **kw).host_bytes
        == 2 * p
    )
    assert (
        cost.estimate(cfg, plan, t7, 128, policy=cost.ActivationPolicy("full", offload_optimizer=True), **kw).host_bytes
        == 2 * 2 * p
    )
    # nothing offloaded, nothing moved
    assert cost.estimate(cfg, plan, t7, 128, policy=cost.ActivationPolicy("full"), **kw).host_bytes == 0


def test_planner_offloads_only_where_hbm_needs_it():
    # 32K tokens on 128 TPU7 TensorCores: the step computes for milliseconds, so moving parameters
    # and optimizer state over PCIe each step would dominate it; nothing needs the HBM it frees.
    # (With host transfers unpriced the planner recommended full host offload here.)
    cfg = preset("llama3_1_8b_longctx")
    rec = cost.search(cfg, hw("tpu7"), 128, seq_len=32768, global_batch=1)
    p = rec.best.policy
    assert not (
        p.offload_optimizer or p.offload_params or p.decoder_layer_input == "offload" or p.context == "offload"
    ), p.label
    assert rec.best.est.host_bytes == 0
    offloaded = [c for c in rec.candidates if c.policy.offload_optimizer and c.context_degree == 128]
    assert offloaded and all(c.est.exposed_host_time > 0 for c in offloaded)
    # at 14M tokens the same transfers hide behind the compute: offload costs no time there
    rec = cost.search(cfg, hw("tpu7"), 128, seq_len=14_680_064, global_batch=1)
    assert rec.best.est.host_bytes > 0 and rec.best.est.exposed_host_time == 0


def test_planner_vs_lines_name_the_parameter_sharding():
    cfg = preset("llama3_1_8b_longctx")
    rec = cost.search(cfg, hw("tpu7"), 128, seq_len=32768, global_batch=1)
    vs = [r for r in reasons(rec) if r.lstrip().startswith("vs ")]
    assert vs and all(", params zero3 (" in r or ", params replicated (" in r for r in vs), vs
    assert len(set(vs)) == len(vs)


def test_plan_default_run_prices_its_given_plan(tmp_path, capsys):
    # `python -m lcx.plan` with no override: one sequence and the default plan agree
    from hydra import compose, initialize_config_dir

    from lcx.config import plan_query
    from lcx.plan import run

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        c = compose("plan_config")
    report = run(plan_query(c), tmp_path)
    assert "error" not in report["given"] and report["given"]["estimate"]["fits"]
    assert "does not apply" not in capsys.readouterr().out


def test_estimate_is_the_same_cached_interleaved_or_with_an_unhashable_config():
    """The ledger caches what depends on the config and plan alone (parameter layout, local step
    share): the same call gives the same estimate cold, repeated, after another plan, and with a
    plain namespace (unhashable, so computed uncached) standing in for the model config."""
    import dataclasses
    import types

    from lcx.cost.local import StepSizes
    from lcx.cost.search import candidate_plans

    cfg, h = preset("llama3_1_8b_longctx"), hw("tpu_v5p", calibrated=True)
    step = StepSizes.of_model(cfg, 1_048_576, 2).args()
    (p1, _), (p2, _) = list(candidate_plans(cfg, 64, 1_048_576, 2))[:2]
    pol = cost.ActivationPolicy(remat="full", vocab_tiling=4)

    def key(c, p):
        e = cost.estimate(c, p, h, 64, policy=pol, **step)
        return e.step_time, e.memory.as_dict(), e.comm

    first = key(cfg, p1)
    other = key(cfg, p2)
    assert other != first and key(cfg, p1) == first
    ns = types.SimpleNamespace(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})
    assert key(ns, p1) == first and key(ns, p2) == other
