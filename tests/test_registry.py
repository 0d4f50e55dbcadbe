"""The strategy and kernel registries tell the truth.

Every place that needs a strategy or a kernel (the plan's accepted names and rules, the cost
ledger's prices, the planner's meshes, attention itself) finds it through ONE registry per family
(``lcx.attention.STRATEGIES``, ``lcx.attention.KERNELS``); an unknown name raises with the
choices; and a fifth strategy defined here as one class plus one registry entry is accepted,
validated, priced, searched and run without touching any other file.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import lcx.sharding as sh
from lcx import cost
from lcx.attention import Mask, attention, reference_attention
from lcx.attention.flash import flash_blocks
from lcx.attention.kernels import KERNELS, AbstractKernel, BlockSizes, KernelCall, get_kernel, make_kernel
from lcx.attention.strategies import (
    STRATEGIES,
    AbstractStrategy,
    AttentionShard,
    RingHop,
    SearchMesh,
    Traffic,
    get_strategy,
)
from lcx.cost.planner import candidate_plans
from lcx.models import preset
from lcx.sharding import AttentionConfig, Plan, PlanError, bind

TINY = preset("tiny")  # 4 heads, 1 kv head
POLICY = cost.ActivationPolicy("full")
HW = cost.Hardware(name="test", peak_flops_per_device=1e12, ici_bandwidth_per_chip=1e11)


def _plan(strategy: str, kernel: str = "xla", **attention) -> Plan:
    # 2 x 4 devices: the tiny model's 4 heads allow a Ulysses degree of 4
    mesh = (("data", 2), ("ulysses", 2), ("ring", 2)) if strategy == "usp" else (("data", 2), ("context", 4))
    seq = ("ulysses", "ring") if strategy == "usp" else "context"
    return Plan(
        mesh=mesh,
        activations={"batch": "data", "seq": seq},
        attention=AttentionConfig(strategy=strategy, kernel=kernel, **attention),
    )


def _overridden_concrete_methods(cls: type) -> list[str]:
    """Names ``cls`` defines that a base class already defines concretely (Equinox's rule: a
    concrete method is final, never overridden)."""
    out = []
    for name, value in vars(cls).items():
        if name.startswith("__") or not callable(getattr(cls, name, None)) and not isinstance(value, property):
            continue
        for base in cls.__mro__[1:]:
            if name in vars(base) and not getattr(vars(base)[name], "__isabstractmethod__", False):
                if base is not object:
                    out.append(f"{cls.__name__}.{name} overrides {base.__name__}.{name}")
    return out


# -------------------------------------------------------------------------- the same names everywhere
def test_every_registry_lists_the_same_strategy_names():
    names = tuple(STRATEGIES)
    assert names == ("allgather", "ring", "a2a", "usp", "halo")
    assert tuple(sh.STRATEGIES) == names and sh.STRATEGIES == names  # what the plan accepts
    # halo serves sliding and chunked layer kinds only: no whole-model mesh, no global price
    whole_model = tuple(n for n in names if STRATEGIES[n].search_meshes(2, 4))
    assert whole_model == ("allgather", "ring", "a2a", "usp")
    for name in names:
        plan = _plan(name)  # the plan accepts it and runs its rules
        plan.validate(8, dims=TINY.dims(), seq_len=4096, global_batch=2)
        assert get_strategy(name) is STRATEGIES[name]
        if name not in whole_model:  # TINY's layers are global: refused, never priced wrongly
            with pytest.raises(ValueError, match="global"):
                cost.estimate(TINY, plan, HW, 8, seq_len=4096, global_batch=2, policy=POLICY)
            continue
        # the ledger prices it (memory, communication, time) through the same class
        est = cost.estimate(TINY, plan, HW, 8, seq_len=4096, global_batch=2, policy=POLICY)
        assert est.memory.attention > 0 and est.comm.total > 0
    # the planner tries the meshes of every registered whole-model strategy
    tried = {p.attention.strategy for p, _ in candidate_plans(TINY, 8, 4096, 2)}
    assert tried == set(whole_model)


def test_every_registry_lists_the_same_kernel_names_and_prices_them():
    names = tuple(KERNELS)
    assert names[:2] == ("xla", "splash")
    assert tuple(sh.KERNELS) == names
    call = KernelCall(local_batch=1, q_len=512, kv_len=4096, q_heads=4, kv_heads=1, head_dim=32)
    blocks = BlockSizes(256, 256)
    for name in names:
        cls = get_kernel(name)
        assert issubclass(cls, AbstractKernel) and not inspect.isabstract(cls)
        AttentionConfig(kernel=name)  # the plan accepts it
        for priced in (cls.forward_bytes(call, blocks), cls.backward_bytes(call, blocks), cls.prologue_bytes(call)):
            assert isinstance(priced, int) and priced >= 0
        assert cls.backward_bytes(call, blocks) >= cls.prologue_bytes(call)
        # the ledger's by-name functions read the same class
        assert cost.memory.kernel_forward_bytes(name, call, blocks) == cls.forward_bytes(call, blocks)


def test_registered_classes_are_final_and_override_no_concrete_method():
    for cls in (*STRATEGIES.values(), *KERNELS.values()):
        assert not inspect.isabstract(cls), cls
        assert _overridden_concrete_methods(cls) == [], cls


# -------------------------------------------------------------------------- unknown names
@pytest.mark.parametrize(
    "lookup",
    [
        lambda: get_strategy("cp9"),
        lambda: AttentionConfig(strategy="cp9"),
        lambda: cost.attention_working_bytes(
            "cp9", "xla", AttentionShard.from_model(TINY, seq_len=64, local_batch=1, context_degree=1)
        ),
    ],
)
def test_unknown_strategy_raises_with_the_choices(lookup):
    with pytest.raises(
        ValueError,
        match=r"unknown attention strategy 'cp9'; choose one of \('allgather', 'ring', "
        r"'a2a', 'usp', 'halo'\)",
    ):
        lookup()


@pytest.mark.parametrize(
    "lookup",
    [
        lambda: get_kernel("cudnn"),
        lambda: make_kernel("cudnn", 64, 64),
        lambda: AttentionConfig(kernel="cudnn"),
        lambda: cost.memory.kernel_forward_bytes("cudnn", KernelCall(1, 8, 8, 1, 1, 8)),
    ],
)
def test_unknown_kernel_raises_with_the_choices(lookup):
    with pytest.raises(ValueError, match=r"unknown attention kernel 'cudnn'; choose one of \('xla', 'splash'"):
        lookup()


def test_block_sizes_are_checked_once_with_the_plan_key():
    assert BlockSizes(64, 32).backward == (64, 32) and BlockSizes(64, 32, 16).backward == (16, 32)
    with pytest.raises(ValueError, match=r"plan\.attention\.block_kv must be >= 1 token, got 0"):
        BlockSizes(64, 0)
    with pytest.raises(PlanError, match=r"plan\.attention\.block_q_dkv must be >= 1 token \(or null"):
        AttentionConfig(block_q_dkv=0)
    assert AttentionConfig(block_q=128, block_kv_dkv=64).blocks == BlockSizes(128, 512, None, 64)
    assert make_kernel("xla", AttentionConfig(block_q=128).blocks).blocks == BlockSizes(128)


# -------------------------------------------------------------------------- a fifth strategy
class Halves(AbstractStrategy):
    """A toy fifth strategy: the all-gather program, with rules and prices of its own (a mesh
    axis it needs, a head rule, made-up buffers and traffic) that only this class knows."""

    kernel: AbstractKernel
    mask: Mask = eqx.field(static=True)
    axes: tuple[str, ...] = eqx.field(static=True)
    output_all_to_all: ClassVar[bool] = False

    @classmethod
    def from_plan(cls, kernel, mask, seq_axes, axis_sizes, config):
        return cls(kernel=kernel, mask=mask, axes=tuple(seq_axes))

    def check(self, q_shape, kv_shape):
        return None

    def __call__(self, q, kv, sinks=None, return_lse=False):
        kv = jax.tree.map(lambda x: lax.all_gather(x, self.axes, axis=1, tiled=True), kv)
        return flash_blocks(q, kv, mask=self.mask, kernel=self.kernel, sinks=sinks, return_lse=return_lse)

    @classmethod
    def check_plan_axes(cls, plan):
        if plan.seq_axes != ("context",):
            raise PlanError(f"halves: split the sequence over mesh axis 'context', not {plan.seq_axes}")

    @classmethod
    def check_layer(cls, mask, plan, mesh_shape, seq_len):
        return None

    @classmethod
    def check_plan_dims(cls, plan, mesh_shape, dims, n_devices):
        if dims.get("heads", 2) % 2:
            raise PlanError(f"halves: needs an even number of heads, got {dims['heads']}")

    @classmethod
    def search_meshes(cls, data, context):
        return (SearchMesh((("data", data), ("context", context)), "context", name="halves"),)

    @classmethod
    def all_to_all_degree(cls, config, mesh_shape):
        return 1

    @classmethod
    def kernel_call(cls, s: AttentionShard):
        return s.local_len, s.seq_len, s.heads, s.kv_heads

    @classmethod
    def buffer_bytes(cls, s, *, backward):
        return 1000 if backward else 100

    @classmethod
    def residual_bytes(cls, s):
        return 10

    @classmethod
    def traffic(cls, s, *, layers, replay):
        return Traffic(all_gather=123.0 * layers)

    @classmethod
    def imbalance_degree(cls, context_degree, ulysses_degree):
        return 1

    @classmethod
    def ring_hop(cls, seq_len, context_degree, ulysses_degree, n_heads, n_kv_heads) -> RingHop | None:
        return None


@pytest.mark.slow
def test_a_fifth_strategy_is_one_class_and_one_registry_entry(monkeypatch, devices):
    monkeypatch.setitem(STRATEGIES, "halves", Halves)
    assert "halves" in sh.STRATEGIES
    # the plan accepts the name and runs the class's own rules, with its own messages
    plan = _plan("halves")
    plan.validate(8, dims=TINY.dims(), seq_len=4096, global_batch=2)
    with pytest.raises(PlanError, match="halves: needs an even number of heads, got 3"):
        plan.validate(8, dims={**TINY.dims(), "heads": 3})
    with pytest.raises(PlanError, match="halves: split the sequence over mesh axis 'context'"):
        Plan(
            mesh=(("data", 8),),
            activations={"batch": "data", "seq": "data"},
            attention=AttentionConfig(strategy="halves"),
        )
    # the ledger prices it from the class: its buffers, residuals and traffic
    est = cost.estimate(TINY, plan, HW, 8, seq_len=4096, global_batch=2, policy=POLICY)
    ag = cost.estimate(TINY, _plan("allgather"), HW, 8, seq_len=4096, global_batch=2, policy=POLICY)
    assert est.comm.all_gather == 123.0 * TINY.n_layers and est.comm.all_to_all == est.comm.ring == 0
    # same kernel call as the all-gather's: the phases differ by exactly the classes' own numbers
    s = AttentionShard.from_model(TINY, seq_len=4096, local_batch=1, context_degree=4)
    AG = STRATEGIES["allgather"]
    ag_backward = AG.buffer_bytes(s, backward=True) + AG.residual_bytes(s)
    assert est.memory.attention - ag.memory.attention == 1000 + 10 - ag_backward
    assert est.memory.attention_forward - ag.memory.attention_forward == 100 - AG.buffer_bytes(s, backward=False)
    # the planner searches its meshes
    assert "halves" in {p.attention.strategy for p, _ in candidate_plans(TINY, 8, 4096, 2)}
    # and attention() runs it (all-gather program) against the dense reference
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 64, n, 8), jnp.float32) for i, n in enumerate((2, 1, 1)))
    out = attention(
        q,
        k,
        v,
        plan=bind(
            dataclasses.replace(
                plan, attention=dataclasses.replace(plan.attention, layout="contiguous", block_q=16, block_kv=16)
            ),
            devices,
        ),
        mask=Mask(causal=True),
    )
    ref = reference_attention(q, k, v, mask=Mask(causal=True))
    np.testing.assert_allclose(out, ref, atol=2e-6, rtol=0)


@pytest.mark.parametrize(
    "strategy,scopes",
    [
        ("ring", ("lcx.Ring", "lcx.XlaKernel.forward_step", "lcx.XlaKernel.backward_step")),
        ("allgather", ("lcx.AllGather", "lcx.XlaKernel.forward", "lcx.XlaKernel.backward")),
    ],
)
def test_strategy_and_kernel_calls_are_named_scopes(devices, strategy, scopes):
    """Profiles read as the architecture does: the strategy call runs under
    ``jax.named_scope("lcx.<Strategy>")`` and each kernel call under ``lcx.<Kernel>.<pass>``."""
    plan = bind(_plan(strategy, block_q=16, block_kv=16), devices)
    q, k, v = (jnp.ones((2, 64, n, 8), jnp.float32) for n in (2, 1, 1))
    loss = jax.jit(jax.grad(lambda q: attention(q, k, v, plan=plan, mask=Mask(causal=True)).sum()))
    text = loss.lower(q).as_text(debug_info=True)
    for scope in scopes:
        assert f"{scope}/" in text, f"no op under jax.named_scope({scope!r})"
