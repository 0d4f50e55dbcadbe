"""Vocabulary tiling (``memory.vocab_tiling``): the loss and every gradient equal the untiled
step's on every strategy, layout and the data axis; no ``[b, T, V]`` logits buffer exists in the
compiled step; a tile count that does not divide the local sequence is refused before compiling."""

import dataclasses
import re

import equinox as eqx
import jax
import numpy as np
import pytest
from hydra import compose, initialize_config_module

from lcx.config import run_config
from lcx.models import ModelConfig, init_model, model_shardings
from lcx.sharding import bind
from lcx.sharding.config import preset
from lcx.training.memory import MemoryOptions
from lcx.training.optim import make_optimizer
from lcx.training.step import is_arraylike, loss_function, make_steps
from lcx.training.stepping import put_batch

SMALL = ModelConfig.from_dict(
    dict(name="small", vocab_size=512, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
)


def _config(*overrides):
    with initialize_config_module(config_module="lcx.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def _batch(B, S, layout, degree, V):
    """Rows of three packed documents each (positions restart, segment ids differ), a padded
    tail out of the loss, laid out for the plan like the data pipeline does."""
    from lcx.sharding import apply_layout

    rng = np.random.default_rng(0)
    tok = rng.integers(0, V, (B, S + 1)).astype(np.int32)
    cuts = [0, S // 3 + 5, 2 * S // 3 - 7, S]
    seg = np.concatenate([np.full(b - a, i + 1, np.int32) for i, (a, b) in enumerate(zip(cuts, cuts[1:]))])
    pos = np.concatenate([np.arange(b - a, dtype=np.int32) for a, b in zip(cuts, cuts[1:])])
    mask = np.ones(S, np.float32)
    mask[-9:] = 0.0
    batch = {
        "tokens": tok[:, :-1],
        "targets": tok[:, 1:],
        "positions": np.tile(pos, (B, 1)),
        "segment_ids": np.tile(seg, (B, 1)),
        "loss_mask": np.tile(mask, (B, 1)),
    }
    return {k: np.asarray(apply_layout(v, layout, degree, axis=1)) for k, v in batch.items()}


def _loss_and_grads(model, batch, mp, tiles):
    params, static = eqx.partition(model, is_arraylike)
    params = jax.device_put(params, model_shardings(model, mp))
    b = put_batch(batch, mp.activation_sharding(("batch", "seq")))
    f = loss_function(static, mp, MemoryOptions(vocab_tiling=tiles))
    (loss, (s, c)), g = jax.jit(jax.value_and_grad(f, has_aux=True))(params, b)
    return float(loss), float(c), g


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.slow
@pytest.mark.parametrize(
    "plan_name,layout,tiles",
    [
        ("allgather", "zigzag", 4),
        ("a2a", "contiguous", 2),
        ("ring", "zigzag", 8),
        ("usp", "contiguous", 4),
        ("ring_cp", "contiguous", 16),
        ("fsdp_ring", "zigzag", 4),
    ],
)
def test_tiled_loss_and_grads_equal_untiled(devices, plan_name, layout, tiles):
    plan = preset(plan_name)
    plan = dataclasses.replace(plan, attention=dataclasses.replace(plan.attention, layout=layout))
    n_data = 8 // plan.context_degree(8)
    B, S = 2 * n_data if n_data > 1 else 1, 512
    plan.validate(8, dims=SMALL.dims(), seq_len=S, global_batch=B)
    mp = bind(plan, devices)
    batch = _batch(B, S, layout, mp.context_degree, SMALL.vocab_size)
    model = init_model(SMALL, key=jax.random.key(1))
    l1, c1, g1 = _loss_and_grads(model, batch, mp, 1)
    lt, ct, gt = _loss_and_grads(model, batch, mp, tiles)
    assert ct == c1
    np.testing.assert_allclose(lt, l1, rtol=1e-6)
    leaves1, leavest = jax.tree.leaves(g1), jax.tree.leaves(gt)
    assert len(leaves1) == len(leavest) > 0
    for a, b in zip(leavest, leaves1):
        assert _rel(a, b) <= 1e-6, (a.shape, _rel(a, b))


def _hlo_shapes(text: str) -> list[tuple[str, tuple[int, ...]]]:
    """(dtype, dims) of every array shape written in an HLO module's text."""
    out = []
    for dt, dims in re.findall(r"\b(f32|bf16|f16|s32|pred)\[([0-9,]*)\]", text):
        out.append((dt, tuple(int(x) for x in dims.split(",") if x)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("tiles", [1, 4])
def test_no_whole_logits_buffer_in_the_compiled_step(devices, tiles):
    # ring over 8 devices, one sequence of 2048 tokens: T = 256 local tokens, V = 4096; the
    # whole local logits are 256 x 4096 = 1 Mi floats, more than any weight ([V, D] = 128 Ki)
    cfg = dataclasses.replace(SMALL, vocab_size=4096)
    plan = preset("ring_cp")
    mp = bind(plan, devices)
    model = eqx.filter_eval_shape(init_model, cfg, key=jax.random.key(0))
    psh = model_shardings(model, mp)
    opt, _ = make_optimizer(lr=1e-3, steps=10, warmup_steps=1)
    steps = make_steps(model, opt, mp, psh, MemoryOptions(vocab_tiling=tiles))
    params = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        eqx.filter(model, is_arraylike),
        steps.param_shardings,
    )
    opt_state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        jax.eval_shape(opt.init, params),
        steps.opt_shardings,
    )
    S, T, V = 2048, 256, 4096
    batch = {
        k: jax.ShapeDtypeStruct((1, S), np.float32 if k == "loss_mask" else np.int32, sharding=steps.batch_sharding)
        for k in ("tokens", "targets", "positions", "segment_ids", "loss_mask")
    }
    with jax.numpy_dtype_promotion("standard"):  # optax's bias correction: float ** int32 step
        text = steps.train.lower(params, opt_state, batch).compile().as_text()
    sizes = [int(np.prod(d)) for _, d in _hlo_shapes(text)]
    whole = T * V
    biggest = max(sizes)
    if tiles == 1:
        assert biggest >= whole  # the untiled step does hold them: the check can fail
    else:
        assert biggest <= whole // tiles, f"a buffer of {biggest} elements >= the tile's {whole // tiles}"


def test_tiling_that_does_not_divide_the_local_sequence_is_refused(devices):
    from lcx.training.preflight import check

    # 4096 tokens over context 4: 1024 local tokens; 48 does not divide 1024, 32 and 64 do
    cfg = _config("memory.vocab_tiling=48")
    with pytest.raises(
        ValueError,
        match=r"memory.vocab_tiling=48 does not divide the local sequence of 1,024 tokens"
        r".*nearest valid N is 32.*valid neighbours: 32, 64",
    ):
        check(run_config(cfg), devices)


@pytest.mark.parametrize(
    "override,match",
    [
        ("memory.vocab_tiling=0", "must be a whole number >= 1"),
        ("memory.offload_params=off", "must be true or false"),
        ("+memory.vocab_tilling=4", "unknown key"),
        ("+memory.remat=full", "set model.remat instead"),
    ],
)
def test_bad_memory_options_are_refused(devices, override, match):
    from lcx.training.preflight import check

    with pytest.raises(ValueError, match=match):
        check(run_config(_config(override)), devices)
