"""The optimizer: weight decay by parameter role (never by rank) for every model preset and
option that adds parameters; a warmup whose first step has a non-zero rate; step 1 moves the
parameters."""

import dataclasses
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lcx.models import PRESETS, ROLES, decay_mask, init_model, param, parameter_roles, parameters, preset
from lcx.training.optim import make_optimizer

# roles that must never be decayed, recognised from the parameter's path (independently of the
# role table, so a norm declared with a decayed role fails here)
NEVER_DECAYED = ("norm", "bias", "sink")

LR, WD = 0.5, 0.1


def _shrunk(name: str, **options):
    """Preset ``name`` at a size one CPU initialises in milliseconds, with its options kept."""
    cfg = preset(name)
    return dataclasses.replace(
        cfg, vocab_size=64, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=32, **options
    )


# every preset, each with and without the options that add or remove parameters
FAMILIES = [
    pytest.param(_shrunk(name, attention_sinks=sinks, tie_embeddings=tied), id=f"{name}-sinks{sinks:d}-tied{tied:d}")
    for name in sorted(PRESETS)
    for sinks in (False, True)
    for tied in (False, True)
]


def _one_update_with_zero_gradients(model):
    """Parameters after one AdamW update whose gradient is zero: only the decay moves them."""
    params = eqx.filter(model, eqx.is_array)
    opt, _ = make_optimizer(lr=LR, steps=4, warmup_steps=0, weight_decay=WD)
    state = opt.init(params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    with jax.numpy_dtype_promotion("standard"):  # optax's bias correction: float ** int32 step
        updates, _ = opt.update(zeros, state, params)
    rate = float(make_optimizer(lr=LR, steps=4, warmup_steps=0)[1](0))
    return params, optax.apply_updates(params, updates), rate


@pytest.mark.parametrize("cfg", FAMILIES)
def test_norms_biases_and_sinks_are_never_decayed(cfg):
    model = init_model(cfg, key=jax.random.key(0))
    before, after, rate = _one_update_with_zero_gradients(model)
    seen = set()
    for p, b, a in zip(parameters(before), jax.tree.leaves(before), jax.tree.leaves(after)):
        b, a = np.asarray(b), np.asarray(a)
        seen.add(p.role)
        if any(word in p.path.lower() for word in NEVER_DECAYED):
            assert np.array_equal(a, b), f"{p.path} (role {p.role!r}, shape {b.shape}) was decayed"
        if ROLES[p.role]:
            np.testing.assert_allclose(a, b * (1 - rate * WD), rtol=1e-6, err_msg=p.path)
        else:
            assert np.array_equal(a, b), f"{p.path} has role {p.role!r}, which is not decayed, but changed"
    # the norm gains ([L, D] in the stacked blocks: rank 2) are among them
    assert {"norm", "weight", "embedding"} <= seen
    assert ("sink" in seen) == cfg.attention_sinks


def test_roles_of_the_stacked_blocks_do_not_follow_rank():
    cfg = _shrunk("tiny", attention_sinks=True)
    roles = parameter_roles(init_model(cfg, key=jax.random.key(0)))
    mask = decay_mask(eqx.filter(init_model(cfg, key=jax.random.key(0)), eqx.is_array))
    assert roles.blocks.attn_norm.weight == "norm" and mask.blocks.attn_norm.weight is False  # [L, D]
    assert roles.blocks.attn.sinks == "sink" and mask.blocks.attn.sinks is False  # [L, N]
    assert roles.final_norm.weight == "norm" and mask.final_norm.weight is False  # [D]
    assert mask.blocks.attn.wq is True and mask.embed.weight is True and mask.head is True


def test_a_parameter_without_a_role_is_refused():
    class Untyped(eqx.Module):
        w: jax.Array = eqx.field(metadata={"axes": ("embed",)})

    with pytest.raises(ValueError, match=r"parameter \.w declares no role"):
        decay_mask(Untyped(jnp.ones(3)))
    with pytest.raises(ValueError, match="parameter role 'gain' is unknown"):
        param("embed", role="gain")


def test_warmup_starts_above_zero_and_ends_at_the_final_rate():
    _, schedule = make_optimizer(lr=3.0, steps=10, warmup_steps=3, min_lr_ratio=0.1)
    rates = [float(schedule(c)) for c in range(10)]  # optax's count c is step c + 1
    assert rates[:3] == pytest.approx([1.0, 2.0, 3.0])  # lr * k / warmup for steps k = 1, 2, 3
    cos = [0.3 + 2.7 * (1 + math.cos(math.pi * (k - 3) / 7)) / 2 for k in range(4, 11)]
    assert rates[3:] == pytest.approx(cos)
    assert rates[-1] == pytest.approx(0.3)  # the last step has exactly the final rate
    # no warmup: the first step is the cosine's first step, just under the peak
    _, no_warmup = make_optimizer(lr=3.0, steps=10, warmup_steps=0)
    assert float(no_warmup(0)) == pytest.approx(0.3 + 2.7 * (1 + math.cos(math.pi / 10)) / 2)


def test_the_first_step_moves_every_parameter():
    """The default warmup (10% of the steps): step 1 has a non-zero rate and changes every
    parameter that has a gradient."""
    model = init_model(_shrunk("tiny"), key=jax.random.key(0))
    params = eqx.filter(model, eqx.is_array)
    opt, schedule = make_optimizer(lr=3e-3, steps=60, warmup_steps=6)
    assert float(schedule(0)) == pytest.approx(3e-3 / 6)
    grads = jax.tree.map(lambda x: jax.random.normal(jax.random.key(1), x.shape, x.dtype), params)
    with jax.numpy_dtype_promotion("standard"):
        updates, _ = opt.update(grads, opt.init(params), params)
    after = optax.apply_updates(params, updates)
    for p, b, a in zip(parameters(params), jax.tree.leaves(params), jax.tree.leaves(after)):
        assert not np.any(np.asarray(a) == np.asarray(b)), f"step 1 left entries of {p.path} unchanged"
