"""The TPU-lowering battery: every registered strategy x Pallas kernel x layout x layer kind, forward
and backward, in bfloat16 and float32, lowered for TPU with interpret mode off, on this CPU machine.

Beside the conformance battery (tests/test_conformance.py, which runs the kernels in interpret
mode against the float32 reference), this one checks what a TPU would be handed: each Pallas
kernel of :data:`lcx.attention.kernels.KERNELS` (those whose class declares
``mosaic_calls_per_chunk``) is traced under :func:`lcx.attention.kernels.pallas_interpret`
``(False)`` and lowered with ``lowering_platforms=("tpu",)``, which runs Pallas' TPU lowering:
block shapes against Mosaic's (8, 128) tiling, layouts, dtypes, scalar prefetch. Nothing is compiled
(Mosaic's compiler needs a TPU) and nothing runs.

What each program must show, so that neither interpret mode nor a fallback passes:

- every ``pallas_call`` of the traced program is a Mosaic ``tpu_custom_call`` in the lowered module
  (interpret mode inlines the kernel body: 0 Mosaic calls);
- the number of Mosaic calls is what the kernel's invocations predict: ``forward`` /
  ``backward`` traced ``f`` / ``b`` times give ``f * F + b * Bk`` calls, ``(F, Bk)`` the
  kernel's ``mosaic_calls_per_chunk`` (one kv chunk at these shapes), and each layer kind invokes
  both at least once;
- lcx's plain-XLA attention (:class:`~lcx.attention.kernels.XlaKernel`, the dense reference) is never
  traced: a strategy that routed a layer kind to it fails here.

Shapes are TPU-like but small: B 2, S 512 over data 2 x (ulysses 2 x ring 2), 8 query / 2 kv heads
(GQA) of 128, blocks 128 x 128; the layer kinds and their window / chunk / documents / sinks are
the conformance battery's. Layouts whose strategy objects are equal share one lowering (the
layout changes only the data then), as in the conformance battery.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lcx.attention import attention
from lcx.attention.api import build_strategy
from lcx.attention.kernels import KERNELS, KernelNotAvailableError, XlaKernel, pallas_interpret
from lcx.attention.kernels.interpret import interpret, mosaic_calls, pallas_equations
from lcx.attention.strategies import STRATEGIES
from lcx.models import LayerKind, ModelConfig, init_model
from lcx.sharding import AttentionConfig, MeshPlan, Plan, PlanError, bind
from lcx.sharding.layout import LAYOUTS

sys.path.insert(0, str(Path(__file__).parent))
import test_conformance as conformance  # noqa: E402  (mesh, layer kinds, admission)

B, T, N, K, H = 2, 512, 8, 2, 128
BLOCK = 128
DIMS = {"heads": N, "kv_heads": K, "head_dim": H}
PALLAS = tuple(name for name, cls in KERNELS.items() if cls.mosaic_calls_per_chunk is not None)
# bfloat16 (what TPU training runs) for every layer kind; float32 for one of each kind with
# documents and sinks (the widest mask data and the sink path in the other dtype)
DTYPES = {
    "bfloat16": conformance.KINDS,
    "float32": tuple(k for k in conformance.KINDS if k.document and k.sinks),
}


def admit(strategy: str, kernel: str, layout: str, kind) -> Plan | PlanError:
    """The validated plan at this battery's shapes, or the ``PlanError`` refusing it."""
    try:
        plan = Plan(
            mesh=conformance.MESH,
            activations=conformance.ACTIVATIONS,
            attention=AttentionConfig(strategy=strategy, kernel=kernel, layout=layout, block_q=BLOCK, block_kv=BLOCK),
        )
        plan.validate(conformance.N_DEVICES, dims=DIMS, seq_len=T, global_batch=B)
        conformance.check_layer_kinds([kind.mask], plan, conformance.N_DEVICES, T)
    except PlanError as e:
        return e
    return plan


ENTRY_POINTS = tuple(f"{d}{part}" for d in ("forward", "backward") for part in ("", "_start", "_step", "_finish"))
"""Every method through which a strategy runs a kernel (the one-block and the accumulating forms)."""


@dataclasses.dataclass
class Counter:
    """Trace-time invocations of a kernel class's ``forward`` and ``backward``."""

    forward: int = 0
    backward: int = 0


@contextlib.contextmanager
def counting(cls):
    """Count ``cls.forward`` / ``cls.backward`` calls while tracing, and make any trace of lcx's
    XLA attention (the kernel or the dense reference) fail loudly."""
    counter = Counter()
    saved = {name: getattr(cls, name) for name in ("forward", "backward")}

    def wrap(name):
        fn = saved[name]

        def counted(self, *args, **kwargs):
            setattr(counter, name, getattr(counter, name) + 1)
            return fn(self, *args, **kwargs)

        return counted

    def refuse(*args, **kwargs):
        raise AssertionError("XLA attention was traced inside a Pallas program: a fallback")

    xla_saved = {name: getattr(XlaKernel, name) for name in ENTRY_POINTS}
    try:
        for name in saved:
            setattr(cls, name, wrap(name))
        for name in xla_saved:
            setattr(XlaKernel, name, refuse)
        yield counter
    finally:
        for name, fn in saved.items():
            setattr(cls, name, fn)
        for name, fn in xla_saved.items():
            setattr(XlaKernel, name, fn)


@dataclasses.dataclass
class Lowered:
    """One lowered program: the layer kinds it holds and its counts."""

    kinds: tuple[str, ...]
    mosaic: int
    pallas: int
    forward_calls: int
    backward_calls: int


def _abstract(dtype) -> tuple:
    q = jax.ShapeDtypeStruct((B, T, N, H), dtype)
    kv = jax.ShapeDtypeStruct((B, T, K, H), dtype)
    ids = jax.ShapeDtypeStruct((B, T), jnp.int32)
    return q, kv, kv, ids, ids, jax.ShapeDtypeStruct((N,), jnp.float32)


def lower(mp: MeshPlan, kinds: tuple, dtype, *, mode: bool | None = False) -> Lowered:
    """Trace and lower for TPU, under ``pallas_interpret(mode)``, one program holding every kind
    of ``kinds`` forward and backward through the public :func:`lcx.attention.attention`."""

    def f(q, k, v, pos, seg, sinks):
        def loss(q, k, v, sinks, kind):
            o, lse = attention(
                q,
                k,
                v,
                plan=mp,
                mask=kind.mask,
                positions=pos,
                segment_ids=seg,
                sinks=sinks if kind.sinks else None,
                return_lse=True,
            )
            return o.astype(jnp.float32).sum() + jnp.where(jnp.isfinite(lse), lse, 0.0).sum()

        return {kind.name: jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, sinks, kind) for kind in kinds}

    cls = KERNELS[mp.plan.attention.kernel]
    with pallas_interpret(mode), counting(cls) as counter:
        traced = jax.jit(f).trace(*_abstract(dtype))
        text = traced.lower(lowering_platforms=("tpu",)).as_text()
    return Lowered(
        tuple(k.name for k in kinds),
        mosaic_calls(text),
        pallas_equations(traced.jaxpr),
        counter.forward,
        counter.backward,
    )


def check(kernel: str, low: Lowered) -> list[str]:
    """What is wrong with one lowered program (module docstring); empty when nothing is."""
    per_fwd, per_bwd = KERNELS[kernel].mosaic_calls_per_chunk
    want = low.forward_calls * per_fwd + low.backward_calls * per_bwd
    bad = []
    if low.mosaic != low.pallas:
        bad.append(f"{low.pallas} Pallas calls traced but {low.mosaic} Mosaic calls lowered (interpret mode?)")
    if low.mosaic != want:
        bad.append(f"{low.mosaic} Mosaic calls, {want} expected from the kernel's invocations")
    n = len(low.kinds)
    if low.forward_calls < n or low.backward_calls < n:
        bad.append(f"{low.forward_calls} forward / {low.backward_calls} backward kernel calls for {n} layer kinds")
    return bad


def run_battery(strategy: str, kernel: str, *, mode: bool | None = False) -> dict:
    """Lower every admitted (layout, dtype) group of ``strategy`` x ``kernel``; returns
    ``{"lowered": [(layouts, dtype, Lowered)], "refused": {(layout, kind): message}}``."""
    refused, groups = {}, {}
    for layout in LAYOUTS:
        plans = {}
        for kind in conformance.KINDS:
            verdict = admit(strategy, kernel, layout, kind)
            if isinstance(verdict, PlanError):
                assert kind.kind in str(verdict), f"{strategy} refuses {kind.name} without naming it: {verdict}"
                refused[layout, kind.name] = str(verdict)
            else:
                plans[kind] = verdict
        if not plans:
            continue
        mp = bind(next(iter(plans.values())), jax.devices()[: conformance.N_DEVICES])
        built = tuple((kind, build_strategy(mp, kind.mask, (B, T, N, H), (B, T, K, H))[0]) for kind in plans)
        groups.setdefault(built, []).append((layout, mp))
    lowered = []
    for built, members in groups.items():
        for dtype, kinds in DTYPES.items():
            run = tuple(kind for kind, _ in built if kind in kinds)
            if run:
                low = lower(members[0][1], run, jnp.dtype(dtype), mode=mode)
                lowered.append((tuple(layout for layout, _ in members), dtype, low))
    return {"lowered": lowered, "refused": refused}


COMBINATIONS = [(s, k) for s in STRATEGIES for k in PALLAS]


@pytest.mark.parametrize("strategy,kernel", COMBINATIONS, ids=[f"{s}-{k}" for s, k in COMBINATIONS])
def test_strategy_kernel_lowers_for_tpu(strategy, kernel):
    try:
        KERNELS[kernel].check_blocks(conformance.BlockSizes(BLOCK, BLOCK))
    except KernelNotAvailableError as e:
        pytest.skip(f"kernel {kernel!r} cannot run here: {e}")
    report = run_battery(strategy, kernel)
    bad = [
        f"{strategy}/{kernel}/{'+'.join(lay)}/{dt} {low.kinds}: {b}"
        for lay, dt, low in report["lowered"]
        for b in check(kernel, low)
    ]
    assert not bad, "\n".join(bad)
    covered = {(layout, kind) for lay, dt, low in report["lowered"] for layout in lay for kind in low.kinds}
    for layout in LAYOUTS:  # every kind of every layout is lowered (bfloat16) or refused by name
        for kind in conformance.KINDS:
            assert (layout, kind.name) in covered or (layout, kind.name) in report["refused"]
        assert any(lay == layout for lay, _ in covered), f"{strategy}/{kernel} lowers nothing under {layout}"
    assert {dt for _, dt, _ in report["lowered"]} == set(DTYPES)


def test_battery_fails_in_interpret_mode():
    """Put back into interpret mode, a kernel lowers to no Mosaic call and the battery says so."""
    kernel = PALLAS[0]
    kind = conformance.Kind("sliding", True, True)
    mp = bind(admit("ring", kernel, "zigzag", kind), jax.devices()[: conformance.N_DEVICES])
    low = lower(mp, (kind,), jnp.bfloat16, mode=True)
    assert low.mosaic == 0 and low.pallas > 0
    assert any("interpret mode" in b for b in check(kernel, low))
    assert not check(kernel, lower(mp, (kind,), jnp.bfloat16, mode=False))


def test_battery_fails_on_an_xla_fallback(monkeypatch):
    """A strategy whose layer kind computes its attention with XLA instead of the plan's kernel
    is caught while tracing (here: the ring's kernel swapped for the XLA one)."""
    kernel = PALLAS[0]
    kind = conformance.Kind("global", True, False)
    mp = bind(admit("ring", kernel, "zigzag", kind), jax.devices()[: conformance.N_DEVICES])
    import lcx.attention.api as api

    real = api.build_strategy

    def xla_strategy(*args, **kwargs):
        strategy, specs = real(*args, **kwargs)
        return eqx.tree_at(lambda s: s.kernel, strategy, XlaKernel(BLOCK, BLOCK)), specs

    monkeypatch.setattr(api, "build_strategy", xla_strategy)
    with pytest.raises(AssertionError, match="fallback"):
        lower(mp, (kind,), jnp.bfloat16)


# -------------------------------------------------------------------- what a TPU cannot run
# Block sizes a Pallas kernel cannot tile on a TPU (Mosaic's (8, 128) rule, module docstring of
# lcx.attention.kernels.splash): lcx refuses each when the plan is built, naming the key; with
# that check switched off, Pallas' own TPU lowering refuses the same program, so the refusal
# stands for a real TPU failure and not a rule of lcx's own.
UNTILEABLE = {"block_kv": dict(block_kv=64), "block_q": dict(block_q=12), "block_q_dkv": dict(block_q_dkv=64)}


@pytest.mark.parametrize("kernel", PALLAS)
@pytest.mark.parametrize("key", UNTILEABLE)
def test_untileable_blocks_are_refused_before_lowering(kernel, key, monkeypatch):
    try:
        KERNELS[kernel].check_blocks(conformance.BlockSizes(BLOCK, BLOCK))
    except KernelNotAvailableError as e:
        pytest.skip(f"kernel {kernel!r} cannot run here: {e}")
    blocks = dict(block_q=BLOCK, block_kv=BLOCK) | UNTILEABLE[key]

    def plan():
        return Plan(
            mesh=conformance.MESH,
            activations=conformance.ACTIVATIONS,
            attention=AttentionConfig(strategy="allgather", kernel=kernel, layout="zigzag", **blocks),
        )

    with pytest.raises(PlanError, match=f"plan.attention.{key}"):
        plan()
    monkeypatch.setattr(KERNELS[kernel], "check_blocks", classmethod(lambda cls, b: None))
    mp = bind(plan(), jax.devices()[: conformance.N_DEVICES])
    with pytest.raises(ValueError, match="multiple of 128|divisible by 8 and 128"):
        lower(mp, (conformance.Kind("global", True, False),), jnp.bfloat16)


# -------------------------------------------------------------------- the switch itself
def test_interpret_switch_defaults_to_the_backend_and_nests():
    assert interpret() is (jax.default_backend() != "tpu")
    with pallas_interpret(False):
        assert interpret() is False
        with pallas_interpret(True):
            assert interpret() is True
        with pallas_interpret(None):
            assert interpret() is (jax.default_backend() != "tpu")
        assert interpret() is False
    assert interpret() is (jax.default_backend() != "tpu")
    with pytest.raises(TypeError, match="'off'"):  # lcx's message, or beartype's under the tests' hook
        with pallas_interpret("off"):  # type: ignore[arg-type]
            pass


# -------------------------------------------------------------------- prefill and decode
GEN_MODEL = ModelConfig(
    vocab_size=256,
    d_model=256,
    n_layers=3,
    n_heads=4,
    n_kv_heads=2,
    head_dim=128,
    mlp_dim=512,
    layer_pattern=(
        LayerKind("sliding", window=7, sinks=True),
        LayerKind("chunked", chunk=6),
        LayerKind("global", sinks=True),
    ),
)
GEN_STRATEGIES = {  # every strategy that serves a layer kind of GEN_MODEL, and its mesh
    "ring+halo": ({"global": "ring", "sliding": "halo", "chunked": "halo"}, {}),
    "allgather": ("allgather", {}),
    "a2a": ("a2a", {}),
    "usp": ("usp", {"ulysses_axis": "ulysses", "ring_axis": "ring"}),
}


def _lowering_stub(fn, record: list):
    """A stand-in for an ``eqx.filter_jit`` function of lcx.generate.engine: records the TPU
    lowering of the call (interpret mode off) and returns zeros of its result's shapes, so nothing
    runs."""
    raw = fn.__wrapped__

    def stub(*args, **kwargs):
        dyn, static = eqx.partition((args, kwargs), lambda x: isinstance(x, (jax.Array, jax.ShapeDtypeStruct)))

        def f(dyn):
            a, kw = eqx.combine(dyn, static)
            return raw(*a, **kw)

        with pallas_interpret(False):
            traced = jax.jit(f).trace(dyn)
            text = traced.lower(lowering_platforms=("tpu",)).as_text()
        record.append((mosaic_calls(text), pallas_equations(traced.jaxpr)))
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(f, dyn))  # small: caches

    return stub


@pytest.mark.parametrize("kernel", PALLAS)
@pytest.mark.parametrize("name", GEN_STRATEGIES)
def test_prefill_and_decode_lower_for_tpu(kernel, name, monkeypatch):
    """Prefill under every strategy with the Pallas kernel lowers every attention call to Mosaic
    (none to XLA attention); the decode step lowers for TPU too, with its attention in plain XLA by
    design (one query per row against each device's cache shard, merged by logsumexp:
    lcx.generate.layers.decode_attention), so it has no Mosaic call."""
    try:
        KERNELS[kernel].check_blocks(conformance.BlockSizes(BLOCK, BLOCK))
    except KernelNotAvailableError as e:
        pytest.skip(f"kernel {kernel!r} cannot run here: {e}")
    from lcx.generate import engine

    strategy, extra = GEN_STRATEGIES[name]
    mesh = conformance.MESH if name == "usp" else (("data", 2), ("context", 4))
    rules = conformance.ACTIVATIONS if name == "usp" else {"batch": "data", "seq": "context"}
    att = AttentionConfig(strategy=strategy, kernel=kernel, layout="zigzag", block_q=BLOCK, block_kv=BLOCK, **extra)
    mp = bind(Plan(mesh=mesh, activations=rules, attention=att), jax.devices()[: conformance.N_DEVICES])
    model = eqx.filter_eval_shape(init_model, GEN_MODEL, key=jax.random.key(0))
    prefills, decodes = [], []
    monkeypatch.setattr(engine, "_prefill", _lowering_stub(engine._prefill, prefills))
    monkeypatch.setattr(engine, "shard_model", lambda m, mp: m)  # abstract: nothing to place
    cls = KERNELS[kernel]
    with counting(cls) as counter:
        pre = engine.prefill(model, [np.arange(300) % 256, np.arange(170) % 256], plan=mp, max_new_tokens=4)
    (mosaic, pallas), want = prefills[0], counter.forward * cls.mosaic_calls_per_chunk[0]
    assert mosaic == pallas == want and counter.forward >= len(GEN_MODEL.layer_pattern), (mosaic, pallas, counter)
    monkeypatch.setattr(engine, "_decode", _lowering_stub(engine._decode, decodes))
    engine._decode(model, pre.state, jnp.zeros(pre.state.pos.shape, jnp.int32), layout=pre.layout, plan=mp)
    assert decodes == [(0, 0)]


# -------------------------------------------------------------------- the published recipes
RECIPES = {"longctx_4m_v5p": 64, "longctx_14m_tpu7": 128}  # experiment -> devices of its mesh
_LOWER_RECIPE = """
import dataclasses, json, sys
import jax
jax.config.update("jax_num_cpu_devices", int(sys.argv[2]))
from hydra import compose, initialize_config_module
from lcx.config import register, run_config
from lcx.training.lowering import lower_train_step
register()
with initialize_config_module("lcx.conf", version_base="1.3"):
    config = run_config(compose("config", overrides=["experiment=" + sys.argv[1]]))
print(json.dumps(dataclasses.asdict(lower_train_step(config)) | {"seq_len": config.train.seq_len}))
"""


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_train_step_lowers_for_tpu(recipe):
    """MaxText's published recipes as lcx runs them (experiment=longctx_*: ring + zigzag, splash
    blocks 1024 / 2048, remat custom with layer input and context offloaded, vocab tiling 16, and
    for 14M optimizer and parameter offload), at their FULL sequence length on the 64 / 128
    devices of their meshes (simulated), lower for TPU: every Pallas call a Mosaic call, and the
    host-offload annotations where the recipe asks for them. Its own process: the test session has
    8 devices."""
    import json
    import os
    import subprocess

    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-c", _LOWER_RECIPE, recipe, str(RECIPES[recipe])],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"\n{recipe}: {got}")
    assert got["n_devices"] == RECIPES[recipe] and got["seq_len"] >= 4 * 2**20
    per_fwd, per_bwd = KERNELS["splash"].mosaic_calls_per_chunk
    # ring forward: the first hop and the scan body; backward: both again (custom VJP), each its
    # dQ and dK/dV kernels -- once each in the layer scan's body
    assert got["mosaic_calls"] == got["pallas_calls"] == 2 * per_fwd + 2 * per_bwd
    # remat_layer_input=offload and remat_context=offload: the layer input x and the flash
    # output and logsumexp go to host memory (three copies in the layer scan's body)
    offloaded = 2 * (got["param_leaves"] + got["opt_leaves"])  # argument and result of each leaf
    if recipe == "longctx_4m_v5p":
        assert got["host_copies"] == 3 and got["host_arguments"] == 0
    else:  # and the parameters and the optimizer state live in host memory between steps
        assert got["host_arguments"] == offloaded
        assert got["host_copies"] >= 3 + got["param_leaves"] + got["opt_leaves"]
