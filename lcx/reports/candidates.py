"""The planner's candidates as a text table: one row per (strategy, mesh, parameter sharding).

Text only, from the numbers :func:`lcx.cost.planner.search` returns (a
:class:`~lcx.cost.search.Recommendation` of :class:`~lcx.cost.search.Candidate`), as
:mod:`lcx.reports.planner`'s sentences are. The table lays the numbers out in columns and shares
no helper with the sentences.
"""

from __future__ import annotations

from lcx.cost.search import Candidate, Recommendation, rank


def table(rec: Recommendation, *, per_group: bool = True) -> str:
    """The candidates as a text table: per (strategy, mesh, param sharding) the fastest fitting
    policy (or the smallest footprint if none fits), sorted by context degree then step time."""
    groups: dict[tuple, Candidate] = {}
    for c in rec.candidates:
        key = (c.plan.name, c.mesh_label, c.param_sharding)
        cur = groups.get(key)
        if cur is None or _better(c, cur):
            groups[key] = c
    rows = sorted(
        groups.values() if per_group else rec.candidates,
        key=lambda c: (c.context_degree, not c.est.fits, c.est.step_time),
    )
    hdr = (
        "strategy",
        "mesh",
        "params",
        "policy",
        "P",
        "state",
        "acts",
        "work",
        "total",
        "host",
        "compute s",
        "exp.comm s",
        "exp.host s",
        "overlap",
        "fits",
        "MFU",
    )
    body = []
    for c in rows:
        e, m = c.est, c.est.memory
        body.append(
            (
                c.plan.name + ("*" if c is rec.best else ""),
                c.mesh_label,
                c.param_sharding,
                c.policy.label,
                str(c.context_degree),
                _g(m.state),
                _g(m.activations),
                _g(m.working),
                _g(m.total),
                _g(m.host),
                f"{e.compute_time:,.2f}",
                f"{e.exposed_comm_time:,.2f}",
                f"{e.exposed_host_time:,.2f}",
                {None: "-", True: "yes", False: "NO"}[e.overlap],
                "yes" if e.fits else "NO",
                f"{100 * e.mfu:.1f}%",
            )
        )
    w = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(hdr)]
    lines = ["  ".join(h.ljust(x) for h, x in zip(hdr, w)), "  ".join("-" * x for x in w)]
    lines += ["  ".join(v.ljust(x) for v, x in zip(b, w)) for b in body]
    lines.append(
        "memory in GiB per device: state = params + grads + optimizer on device; acts = saved "
        "activations; work = block backward + attention + logits transients; host = offloaded. "
        "exp.comm / exp.host: seconds of communication / host transfer not hidden behind compute. "
        "* = recommended. MFU: model FLOPs / peak at the step time (calibrated where the hardware has a time model, "
        "else the roofline, an upper bound)."
    )
    return "\n".join(lines)


def _better(c: Candidate, cur: Candidate) -> bool:
    if c.est.fits != cur.est.fits:
        return c.est.fits
    if c.est.fits:
        return rank(c) < rank(cur)
    return c.est.memory.total < cur.est.memory.total


def _g(n: float) -> str:
    return f"{n / 2**30:,.2f}"
