"""The planner's candidate plans: every valid (mesh, strategy per layer kind, parameter
sharding, layout) for a model, length, batch and device count (:func:`candidate_plans`), which
:mod:`lcx.cost.search` prices. Pure arithmetic on plans: nothing compiles.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from lcx.attention.plan_kinds import check_layer_kinds
from lcx.attention.strategies import STRATEGIES, SearchMesh
from lcx.cost.kinds import layer_groups
from lcx.sharding import Plan, PlanError
from lcx.sharding.plan import AttentionConfig


def divisors(n: int) -> list[int]:
    """Every divisor of ``n >= 1``, ascending (O(sqrt n)): tile counts, device counts."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def candidate_plans(
    cfg,
    n_devices: int,
    seq_len: int,
    global_batch: int,
    *,
    attention: AttentionConfig | None = None,
    kernel: str | None = None,
    packed_documents: bool = False,
    window: int | None = None,
) -> list[tuple[Plan, str]]:
    """Every valid (plan, param sharding) for this model, length, batch and device count.

    For every data degree ``d`` dividing the batch (``d P = n``), the meshes each registered
    strategy proposes (:meth:`~lcx.attention.strategies.AbstractStrategy.search_meshes`:
    ``{data: d, context: P}`` for all-gather, ring and A2A, ``{data: d, ulysses: U, ring: P/U}``
    for USP with ``1 < U < P``), in registry order; each with parameters replicated or ZeRO-3
    sharded along ``embed`` over every mesh axis. Plans that :meth:`~lcx.sharding.Plan.validate`
    refuses (heads, divisibility, layout) are dropped. The layout is the first of zigzag,
    contiguous that applies; with ``packed_documents`` the balanced layout comes first (it
    balances packed documents, which zigzag does not: :mod:`lcx.cost.balance`).

    Layer kinds (:func:`~lcx.cost.kinds.layer_groups`; ``window``: a uniform model's sliding
    window): on each mesh of a strategy, every choice of a strategy per kind that uses that
    strategy somewhere, or only strategies proposing no mesh of their own (halo)
    (:func:`kind_assignments`), all sharing the mesh, each plan once; a plan some kind's strategy
    cannot run (``check_layer``: halo refuses global layers) is dropped. A uniform model gets one
    strategy per mesh, as before, plus such mesh-less ones.
    """
    base = attention or AttentionConfig()
    kern = kernel or base.kernel
    dims = cfg.dims() if hasattr(cfg, "dims") else None
    groups = layer_groups(cfg, window=window)
    kinds = tuple(dict.fromkeys(g.kind for g in groups))
    job = (dims, seq_len, global_batch, tuple(g.mask for g in groups))
    out: list[tuple[Plan, str]] = []
    seen = set()  # meshes several strategies propose give a mixed plan once
    for d in divisors(n_devices):
        if global_batch % d:
            continue
        passengers = [n for n, cls in STRATEGIES.items() if not cls.search_meshes(d, n_devices // d)]
        for strat, sm in strategy_meshes(d, n_devices // d):
            names = tuple(n for n, _ in sm.mesh)
            for sharding in ("zero3", "replicated"):
                params = (("embed", names[0] if len(names) == 1 else names),) if sharding == "zero3" else ()
                for strategy in kind_assignments(strat, kinds, passengers):
                    plan = _first_layout(base, sm, strat, strategy, kern, params, packed_documents, n_devices, job)
                    key = None if plan is None else (plan.mesh, plan.params, plan.activations, plan.attention)
                    if plan is not None and key not in seen:
                        seen.add(key)
                        out.append((plan, sharding))
    return out


def kind_assignments(strategy: str, kinds: Sequence[str], passengers: Sequence[str] = ()) -> list[str | dict[str, str]]:
    """``plan.attention.strategy`` values tried on a mesh of ``strategy`` for a model of these
    layer kinds (first-appearance order): every choice of a registered strategy per kind that
    gives ``strategy`` (the mesh's) to at least one kind, and every choice among ``passengers``
    alone (strategies that propose no mesh of their own, such as halo, which rides on the
    others'); one name where all kinds agree. A uniform model: ``[strategy, *passengers]``."""
    out: list[str | dict[str, str]] = []
    for names in itertools.product(STRATEGIES, repeat=len(kinds)):
        if strategy in names or all(n in passengers for n in names):
            out.append(names[0] if len(set(names)) == 1 else dict(zip(kinds, names)))
    return out


def _first_layout(base, sm, strat, strategy, kernel, params, packed_documents, n_devices, job) -> Plan | None:
    """The plan of ``strategy`` on the search mesh ``sm`` of strategy ``strat`` in the first
    layout that applies (None: none does). zigzag balances causal work; when S is not a multiple
    of 2P the contiguous layout (priced with its causal imbalance) stands in rather than the plan
    being dropped."""
    dims, seq_len, global_batch, masks = job
    # named by its mesh and the strategies it adds ("ring+halo"), or, on a mesh whose strategy it
    # does not use, by its strategies, and the mesh where it has more than a context axis
    # ("halo", "halo@usp2x4")
    names = dict.fromkeys([strategy] if isinstance(strategy, str) else strategy.values())
    if strat in names:
        name = "+".join((sm.name, *(n for n in names if n != strat)))
    else:
        name = "+".join(names) + ("" if sm.seq == "context" else f"@{sm.name}")
    for layout in ("balanced", "zigzag", "contiguous")[0 if packed_documents else 1 :]:
        att = dataclasses.replace(base, strategy=strategy, kernel=kernel, layout=layout, **dict(sm.attention))
        try:
            plan = Plan(
                mesh=sm.mesh,
                params=params,
                activations=(("batch", "data"), ("seq", sm.seq)),
                attention=att,
                name=name + {"zigzag": "", "contiguous": "(contig)", "balanced": "(balanced)"}[layout],
            )
            plan.validate(n_devices, dims=dims, seq_len=seq_len, global_batch=global_batch)
            check_layer_kinds(masks, plan, n_devices, seq_len)
        except PlanError:
            continue
        return plan
    return None


def strategy_meshes(data: int, context: int) -> list[tuple[str, SearchMesh]]:
    """``(strategy name, mesh)`` for every mesh a registered strategy proposes at these degrees,
    in registry order (the planner's tie-break)."""
    return [(name, sm) for name, cls in STRATEGIES.items() for sm in cls.search_meshes(data, context)]
