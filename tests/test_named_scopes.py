"""Every Llama module call runs under a ``jax.named_scope`` (as ``equinox.nn.Linear`` does), so the
lowered program, and a profile of it, names the architecture: embed, blocks, norms, attention
projections, MLP, output head."""

from __future__ import annotations

import re

import equinox as eqx
import jax
import jax.numpy as jnp

import lcx.models as lm
from lcx.sharding import Plan, bind


def test_every_module_call_is_named():
    cfg = lm.PRESETS["tiny"]
    model = lm.init_model(cfg, key=jax.random.key(0))
    plan = bind(Plan(mesh=(("data", -1),), activations={"batch": "data"}), jax.devices()[:1])
    tok = jnp.zeros((1, 16), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(16, dtype=jnp.int32), (1, 16))
    seg = jnp.zeros((1, 16), jnp.int32)
    params, static = eqx.partition(model, eqx.is_array)
    forward = jax.jit(lambda p: eqx.combine(p, static)(tok, pos, seg, plan=plan))
    text = forward.lower(params).as_text(debug_info=True)  # op locations carry the name stack
    # a loc's name is the op's name stack; inside the layer scan it restarts at the scan body
    stacks = [loc.split("/") for loc in re.findall(r'loc\("([^"]*)"', text)]
    for scope in (
        "lcx.Llama",
        "lcx.Llama.features",
        "lcx.Embedding",
        "lcx.Block",
        "lcx.RMSNorm",
        "lcx.Attention",
        "qkv_proj",
        "o_proj",
        "lcx.MLP",
        "lcx.Llama.logits",
    ):
        assert any(scope in stack[:-1] for stack in stacks), (
            f"no op under jax.named_scope({scope!r}) in the lowered forward pass"
        )
