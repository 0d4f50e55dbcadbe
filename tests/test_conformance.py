"""The conformance battery: every registered strategy x kernel x layout x layer kind through ONE
set of checks against the dense single-device float32 reference, on 8 simulated CPU devices.

As optax's tests run every gradient transformation through one battery, this module iterates over
the registries -- :data:`lcx.attention.strategies.STRATEGIES`, :data:`lcx.attention.kernels.KERNELS`,
:data:`lcx.sharding.layout.LAYOUTS` -- and the twelve layer kinds below (global / sliding window /
chunked, each with and without packed documents and with and without sinks), so a strategy or
kernel registered tomorrow is covered without writing a test.

For each combination the strategy is first asked whether it runs it: the plan is built and
validated (:meth:`lcx.sharding.Plan.validate`) and the strategy's
:meth:`~lcx.attention.strategies.AbstractStrategy.check_layer` is called (through
:func:`lcx.attention.check_layer_kinds`, as the training preflight calls it). A refusal must be a
``PlanError`` naming the layer kind; it is counted as refused. Everything else must run through
the public :func:`lcx.attention.attention` and match the reference in the forward (``out`` and
``lse``, within 5e-5) and the backward (``dq``, ``dk``, ``dv`` and, with sinks, ``dsinks``, within
2e-4; the cotangents of ``out`` and ``lse`` are both random), with the tolerances of every strategy
test, never loosened. A kernel whose library is missing here (tokamax below Python 3.12) is
skipped with the kernel's own reason.

Cost (CI runs everything on 2 cores): one compiled program per (strategy, kernel) holds all twelve
layer kinds, and the layouts whose strategy objects are equal (the plan's layout changes nothing
in their program) are runs of that one program; the reference is computed once per layer kind and
laid out for every layout. Shapes are tiny: B 2, S 64, 8 query / 2 kv heads of 8, blocks of 8 x 16
tokens (128 x 128 for kernels that tile no smaller, e.g. splash).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from lcx.attention import Mask, attention, check_layer_kinds, reference_attention
from lcx.attention import strategies as strategy_registry
from lcx.attention.api import build_strategy
from lcx.attention.kernels import KERNELS, KernelNotAvailableError, get_kernel
from lcx.attention.strategies import STRATEGIES, Ring
from lcx.sharding import AttentionConfig, MeshPlan, Plan, PlanError, bind
from lcx.sharding.blocks import BlockSizes
from lcx.sharding.layout import LAYOUTS

sys.path.insert(0, str(Path(__file__).parent))
import test_attention_sinks as sinks_tests  # noqa: E402  (the sink logits)
import test_attention_strategies as strategies  # noqa: E402  (inputs, layouts, tolerances)

OUT_TOL, GRAD_TOL = strategies.OUT_TOL, strategies.GRAD_TOL  # 5e-5 and 2e-4, as every strategy test
B, T, N, H = strategies.B, strategies.T, strategies.N, strategies.H
HEADS = "gqa4"  # 2 kv heads: GQA, and Ulysses' kv replication at degree 4
K = strategies.KV_HEADS[HEADS]

# One mesh every strategy accepts: batch over `data`, the sequence over two axes named as USP
# needs them (the others run over both as one context axis of degree 4).
MESH = (("data", 2), ("ulysses", 2), ("ring", 2))
ACTIVATIONS = {"batch": "data", "seq": ("ulysses", "ring")}
N_DEVICES = 8
DIMS = {"heads": N, "kv_heads": K, "head_dim": H}
# The smallest blocks (block_q, block_kv) each kernel tiles, tried in order: 8 x 16 gives several
# tiles per kernel call; Pallas kernels need kv blocks of 128 lanes (a 16-token shard is padded).
TILINGS = (BlockSizes(8, 16), BlockSizes(128, 128))

# A window and a chunk that do not divide the 8-token chunks of the zigzag layout at degree 4, so
# windows and chunks straddle device boundaries, yet need less than one chunk from a neighbour.
WINDOW, CHUNK = 7, 6
LAYER_MASKS = {"global": {}, "sliding": {"window": WINDOW}, "chunked": {"chunk": CHUNK}}
PADDING = 6  # padding tokens (segment id -1) ending row 1 of the packed-document rows


@dataclasses.dataclass(frozen=True)
class Kind:
    """A layer kind as attention sees it: its mask (kind, documents) and whether it has sinks."""

    kind: str
    document: bool
    sinks: bool

    @property
    def mask(self) -> Mask:
        return Mask(document=self.document, **LAYER_MASKS[self.kind])

    @property
    def name(self) -> str:
        return self.kind + "+doc" * self.document + "+sinks" * self.sinks


KINDS = tuple(Kind(k, d, s) for k in LAYER_MASKS for d in (False, True) for s in (False, True))


@functools.cache
def original(document: bool) -> tuple[np.ndarray, ...]:
    """(q, k, v, positions, segment_ids, dout, dlse) in the original order: one long sequence, or
    packed documents of uneven lengths (positions restarting at 0) with a padding tail."""
    q, k, v, pos, seg, do = strategies.inputs("causal_doc" if document else "causal", HEADS)
    if document:
        seg = seg.copy()
        seg[1, -PADDING:] = -1
    dlse = np.asarray(jax.random.normal(jax.random.key(7), (B, T, N)))
    return q, k, v, pos, seg, do, dlse


def _vjp(fn, kind: Kind, arrays, sinks):
    """``((out, lse), (dq, dk, dv[, dsinks]))`` of ``fn`` (``attention`` or the reference) on one
    layer kind; ``arrays``: ``(q, k, v, positions, segment_ids, dout, dlse)``, the last two the
    cotangents of ``out`` and ``lse``."""
    q, k, v, pos, seg, do, dlse = arrays

    def f(q, k, v, *s):
        return fn(q, k, v, mask=kind.mask, positions=pos, segment_ids=seg, sinks=s[0] if s else None, return_lse=True)

    return strategies._value_and_vjp(f, (do, dlse), q, k, v, *((sinks,) if kind.sinks else ()))


@functools.cache
def reference(kind: Kind):
    """The float32 reference of ``kind`` in the original order: ``((out, lse), grads)``. Eager:
    the twelve kinds share their primitives' compilations (half the CPU time of twelve jits)."""
    return jax.tree.map(np.asarray, _vjp(reference_attention, kind, original(kind.document), sinks_tests.SINKS))


def _err(got, want) -> float:
    """Max abs difference; inf where the infinities (-inf lse of padding rows) or NaNs differ."""
    got, want = np.asarray(got), np.asarray(want)
    finite = np.isfinite(want)
    if not np.array_equal(np.isfinite(got), finite) or not np.array_equal(got[~finite], want[~finite]):
        return float("inf")
    return float(np.abs(got[finite] - want[finite]).max(initial=0.0))


# --------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Report:
    """What the battery did for one (strategy, kernel): errors of every combination it ran and
    the refusal of every one the strategy refused, keyed by ``(layout, kind name)``."""

    strategy: str
    kernel: str
    ran: dict[tuple[str, str], dict[str, float]] = dataclasses.field(default_factory=dict)
    refused: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)

    def mismatches(self) -> list[str]:
        bad = []
        for (layout, kind), errs in self.ran.items():
            over = {n: e for n, e in errs.items() if not e <= (OUT_TOL if n in ("out", "lse") else GRAD_TOL)}
            if over:
                bad.append(f"{self.strategy}/{self.kernel}/{layout}/{kind}: {over}")
        return bad


def tiling(kernel: str) -> BlockSizes:
    """The first of :data:`TILINGS` the kernel accepts.

    Raises:
      KernelNotAvailableError: the kernel's library is missing here.
    """
    for blocks in TILINGS:
        try:
            get_kernel(kernel).check_blocks(blocks)
        except KernelNotAvailableError:
            raise
        except ValueError:
            continue
        return blocks
    raise AssertionError(f"kernel {kernel!r} tiles none of {TILINGS}: add its smallest blocks to TILINGS")


def admit(strategy: str, kernel: str, layout: str, kind: Kind) -> Plan | PlanError:
    """The validated plan of this combination, or the ``PlanError`` refusing it."""
    blocks = tiling(kernel)
    try:
        plan = Plan(
            mesh=MESH,
            activations=ACTIVATIONS,
            attention=AttentionConfig(
                strategy=strategy, kernel=kernel, layout=layout, block_q=blocks.block_q, block_kv=blocks.block_kv
            ),
        )
        plan.validate(N_DEVICES, dims=DIMS, seq_len=T, global_batch=B)
        check_layer_kinds([kind.mask], plan, N_DEVICES, T)  # the strategy's check_layer
    except PlanError as e:
        return e
    return plan


def _program(mp, kinds: tuple[Kind, ...]):
    """One jitted program: every layer kind of ``kinds`` forward and backward through ``attention``
    on ``mp``; takes the laid-out inputs of both document cases (and the sinks)."""
    fn = functools.partial(attention, plan=mp)

    def f(inputs, sinks):
        return {kind.name: _vjp(fn, kind, inputs[kind.document], sinks) for kind in kinds}

    return jax.jit(f, compiler_options=strategies.FAST_COMPILE)


def _lay_out(mp: MeshPlan, document: bool):
    """``x -> x`` laid out as the data pipeline lays out a batch for ``mp`` (its layout, context
    degree and blocks), from the original ids of the (packed-)document rows."""
    att = mp.plan.attention
    ids = original(document)[3:5]
    return lambda x: strategies._lay(x, att.layout, mp.context_degree, ids, max(att.block_q, att.block_kv))


def _compare(got, mp: MeshPlan, kind: Kind) -> dict[str, float]:
    (out, lse), grads = got
    (ref_out, ref_lse), ref_grads = reference(kind)
    lay = _lay_out(mp, kind.document)
    errs = {"out": _err(out, lay(ref_out)), "lse": _err(lse, lay(ref_lse))}
    errs |= {n: _err(g, lay(r)) for n, g, r in zip(("dq", "dk", "dv"), grads, ref_grads)}
    if kind.sinks:  # per head: no sequence axis to lay out
        errs["dsinks"] = _err(grads[3], ref_grads[3])
    return errs


def run_battery(strategy: str, kernel: str, layouts=LAYOUTS, kinds=KINDS) -> Report:
    """Run every admitted combination of ``strategy`` and ``kernel`` (module docstring).

    Raises:
      KernelNotAvailableError: the kernel cannot run here.
    """
    report = Report(strategy, kernel)
    groups: dict[tuple, list[tuple[str, MeshPlan]]] = {}  # equal strategies -> [(layout, mesh plan)]
    for layout in layouts:
        plans: dict[Kind, Plan] = {}
        for kind in kinds:
            verdict = admit(strategy, kernel, layout, kind)
            if isinstance(verdict, PlanError):
                assert kind.kind in str(verdict), f"{strategy} refuses {kind.name} without naming it: {verdict}"
                report.refused[layout, kind.name] = str(verdict)
            else:
                plans[kind] = verdict
        if not plans:
            continue
        mp = bind(next(iter(plans.values())), jax.devices()[:N_DEVICES])
        built = tuple((kind, build_strategy(mp, kind.mask, (B, T, N, H), (B, T, K, H))[0]) for kind in plans)
        groups.setdefault(built, []).append((layout, mp))
    for built, members in groups.items():
        kinds_run = tuple(kind for kind, _ in built)
        program = _program(members[0][1], kinds_run)
        for layout, mp in members:
            inputs = {}
            for document in {kind.document for kind in kinds_run}:
                laid = [*map(_lay_out(mp, document), original(document))]
                inputs[document] = (*strategies.sharded(mp, *laid[:6]), laid[6])
            got = program(inputs, sinks_tests.SINKS)
            for kind in kinds_run:
                report.ran[layout, kind.name] = _compare(got[kind.name], mp, kind)
    return report


# --------------------------------------------------------------------------------------------
COMBINATIONS = [(s, k) for s in STRATEGIES for k in KERNELS]
# The floor stack (-m "not slow") runs the battery on the plain-JAX kernel: every strategy, layout
# and layer kind. Pallas kernels run in interpret mode on CPU, ~4x the compile time per program
# (with halo, ~590 of the battery's ~680 CPU-s on 2 cores): the current stack runs them too.
FLOOR_KERNELS = ("xla",)


@pytest.mark.parametrize(
    "strategy,kernel",
    [pytest.param(s, k, marks=() if k in FLOOR_KERNELS else pytest.mark.slow) for s, k in COMBINATIONS],
    ids=[f"{s}-{k}" for s, k in COMBINATIONS],
)
def test_strategy_kernel_conforms(strategy, kernel):
    try:
        report = run_battery(strategy, kernel)
    except KernelNotAvailableError as e:
        pytest.skip(f"kernel {kernel!r} cannot run here: {e}")
    assert len(report.ran) + len(report.refused) == len(LAYOUTS) * len(KINDS)
    assert not report.mismatches(), "\n".join(report.mismatches())
    # a strategy that refused everything would pass vacuously: each layout runs some kind
    for layout in LAYOUTS:
        assert any(lay == layout for lay, _ in report.ran), f"{strategy}/{kernel} runs nothing under {layout}"


def census() -> tuple[dict[str, int], set[tuple[str, str]]]:
    """Combinations of the full product that run, are refused, or are skipped (kernel missing),
    decided without compiling anything; and the (layout, kind name) pairs that run at all."""
    counts = {"ran": 0, "refused": 0, "skipped": 0}
    running = set()
    for strategy, kernel in COMBINATIONS:
        for layout in LAYOUTS:
            for kind in KINDS:
                try:
                    verdict = admit(strategy, kernel, layout, kind)
                except KernelNotAvailableError:
                    counts["skipped"] += 1
                    continue
                counts["refused" if isinstance(verdict, PlanError) else "ran"] += 1
                running |= set() if isinstance(verdict, PlanError) else {(layout, kind.name)}
    return counts, running


def test_census_covers_the_whole_product(capsys):
    """Every combination is run, refused or skipped, and every layer kind runs under every layout
    with some strategy (so no kind is refused across the board)."""
    counts, running = census()
    total = len(STRATEGIES) * len(KERNELS) * len(LAYOUTS) * len(KINDS)
    assert sum(counts.values()) == total
    assert running == {(layout, kind.name) for layout in LAYOUTS for kind in KINDS}
    with capsys.disabled():
        print(f"\nconformance: {total} combinations: {counts}")


# --------------------------------------------------------------------------------------------
class OffByOneWindow(Ring):
    """A deliberately broken ring: its sliding window sees one key too many (``W + 1``)."""

    @classmethod
    def from_plan(cls, kernel, mask, seq_axes, axis_sizes, config) -> Ring:
        if mask.window is not None:
            mask = dataclasses.replace(mask, window=mask.window + 1)
        return super().from_plan(kernel, mask, seq_axes, axis_sizes, config)


def test_battery_reports_a_broken_strategy(monkeypatch):
    """Registered (in a patched copy of the registry), the broken ring fails the battery on its
    sliding layers and on them only: the battery can fail."""
    monkeypatch.setattr(strategy_registry, "STRATEGIES", {**STRATEGIES, "broken_ring": OffByOneWindow})
    kinds = (Kind("global", True, False), Kind("sliding", False, False), Kind("sliding", True, True))
    report = run_battery("broken_ring", "xla", layouts=("zigzag",), kinds=kinds)
    assert len(report.ran) == 3 and not report.refused
    bad = report.mismatches()
    assert len(bad) == 2 and all("/sliding" in b for b in bad), bad
