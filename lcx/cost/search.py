"""Plan search: price every candidate plan and policy, keep those that fit.

MaxText's advice for long context (find the smallest context degree that fits, then compare
whole-step times; MaxText's context-parallelism docs) made a procedure: enumerate every
valid (data x context) mesh that a registered strategy proposes (all-gather, ring, Ulysses A2A,
USP splits), parameter sharding (replicated or ZeRO-3 over all devices) and activation policy
(remat, host offload); price each with :func:`lcx.cost.ledger.estimate`; keep those whose
per-device memory fits; take the smallest context degree among them, and at that degree the
shortest predicted step (:func:`rank`). :mod:`lcx.reports.planner` says why, in words.
Pure arithmetic: nothing is compiled, no device is touched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from lcx.cost.candidates import candidate_plans as candidate_plans
from lcx.cost.candidates import divisors as divisors
from lcx.cost.candidates import kind_assignments as kind_assignments
from lcx.cost.candidates import strategy_meshes as strategy_meshes
from lcx.cost.hardware import Hardware
from lcx.cost.ledger import Estimate, estimate
from lcx.cost.local import StepSizes
from lcx.cost.policy import REMAT_POLICIES, ActivationPolicy
from lcx.sharding import Plan
from lcx.sharding.plan import AttentionConfig

LCX_REMAT: tuple[str, ...] = REMAT_POLICIES
"""Remat policies ``lcx.models`` implements today (``model.remat``; ``custom`` with its
``model.remat_*`` placements, host offload included): :data:`lcx.models.config.REMAT_POLICIES`."""


def default_policies(host_offload: bool = True) -> list[ActivationPolicy]:
    """Activation policies the planner tries, cheapest recompute first.

    With ``host_offload`` (hardware with known host memory) also MaxText's offload recipes:
    the block input and the attention context to host, then optimizer and parameters as well.
    """
    out = [
        ActivationPolicy("none"),
        ActivationPolicy("dots_with_no_batch_dims_saveable"),
        ActivationPolicy("custom", context="device"),
        ActivationPolicy("full"),
    ]
    if host_offload:
        out += [
            ActivationPolicy("custom", decoder_layer_input="offload", context="offload"),
            ActivationPolicy("full", decoder_layer_input="offload"),
            ActivationPolicy(
                "custom", decoder_layer_input="offload", context="offload", offload_optimizer=True, offload_params=True
            ),
            ActivationPolicy("full", decoder_layer_input="offload", offload_optimizer=True, offload_params=True),
        ]
    # MaxText computes the output head and loss in vocabulary tiles (num_vocab_tiling=16 in its
    # long-context recipes): the float32 logits of a long local sequence are otherwise the largest
    # transient of the step
    out += [dataclasses.replace(p, vocab_tiling=16) for p in out]
    return out


def missing_in_lcx(policy: ActivationPolicy) -> list[str]:
    """What ``lcx.train`` lacks to run ``policy`` (empty: it runs it today).

    ``lcx.models`` runs its remat policies (:data:`LCX_REMAT`), with activation offload only
    through ``custom`` (``full`` with the block input offloaded is ``custom`` with every other
    placement ``remat``); ``lcx.train`` runs vocabulary tiling (``memory.vocab_tiling``: N must
    divide the local sequence, and the planner prices only such N, :func:`valid_tiling`) and
    optimizer and parameter host offload (``memory.offload_optimizer`` /
    ``memory.offload_params``). What it still lacks: a remat policy outside :data:`LCX_REMAT`,
    and the block input offloaded under any policy but ``full`` / ``custom``.
    """
    p = policy
    out = []
    if p.remat not in LCX_REMAT:
        out.append(f"remat={p.remat}")
    elif p.decoder_layer_input == "offload" and p.remat not in ("full", "custom"):
        out.append(f"block-input offload under remat={p.remat}")
    return out


def valid_tiling(n: int, local_seq: int) -> int:
    """The vocabulary tile count ``lcx.train`` accepts nearest to ``n``: a divisor of the local
    sequence ``local_seq`` (tokens per device), the smaller one on a tie (the rule of
    ``lcx.training.memory.MemoryOptions.check_tiling``'s advice). 16 for 114,688 (14,680,064
    tokens / 128) and 65,536; 14 for ``n=15`` at 114,688."""
    if local_seq % n == 0:
        return n
    return min(divisors(local_seq), key=lambda d: (abs(d - n), d))


def train_overrides(policy: ActivationPolicy) -> list[str]:
    """The ``lcx.train`` overrides that train ``policy``: ``model.remat`` and its placements,
    and every ``memory.*`` option (explicit: an experiment may set them otherwise).

    ``full`` with the block input offloaded is ``custom`` with the context and q/k/v
    recomputed. For any other non-``custom`` policy the ``model.remat_*`` placements are set to
    their defaults: the model refuses others without ``custom``, and the experiment these are
    added to may set them.

    Raises:
      ValueError: a policy :func:`missing_in_lcx` says lcx.train cannot run.
    """
    p = policy
    miss = missing_in_lcx(p)
    if miss:
        raise ValueError(f"policy {p.label}: lcx.train cannot run it ({', '.join(miss)})")
    defaults = {"remat_layer_input": "device", "remat_context": "remat", "remat_qkv": "remat"}
    if p.remat == "custom" or p.decoder_layer_input == "offload":
        custom = p.remat == "custom"
        out = [
            "model.remat=custom",
            f"model.remat_layer_input={p.decoder_layer_input}",
            f"model.remat_context={p.context if custom else 'remat'}",
            f"model.remat_qkv={p.qkv if custom else 'remat'}",
        ]
    else:
        # the placements back to their defaults: the experiment a user adds these to may set them
        out = [f"model.remat={p.remat}"] + [f"model.{k}={v}" for k, v in defaults.items()]
    out += [
        f"memory.vocab_tiling={p.vocab_tiling}",
        f"memory.offload_optimizer={str(p.offload_optimizer).lower()}",
        f"memory.offload_params={str(p.offload_params).lower()}",
    ]
    return out


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One priced configuration.

    Attributes:
      plan: the sharding plan (mesh sizes explicit).
      policy: activation policy.
      est: its :class:`~lcx.cost.ledger.Estimate`.
      param_sharding: ``replicated`` or ``zero3`` (parameters split over every mesh axis).
    """

    plan: Plan
    policy: ActivationPolicy
    est: Estimate
    param_sharding: str

    @property
    def context_degree(self) -> int:
        return self.est.n_devices // _data(self.plan)

    @property
    def runnable_in_lcx(self) -> bool:
        """``lcx.train`` runs it today (:func:`missing_in_lcx` is empty)."""
        return not missing_in_lcx(self.policy)

    @property
    def mesh_label(self) -> str:
        return "x".join(f"{n}={s}" for n, s in self.plan.mesh)

    def as_dict(self) -> dict[str, Any]:
        e = self.est
        return {
            "plan": self.plan.to_config(),
            "strategy": self.plan.attention.strategy_config(),
            "mesh": dict(self.plan.mesh),
            "context_degree": self.context_degree,
            "param_sharding": self.param_sharding,
            "policy": dataclasses.asdict(self.policy),
            "policy_label": self.policy.label,
            "runnable_in_lcx": self.runnable_in_lcx,
            **estimate_dict(e),
        }


def _data(plan: Plan) -> int:
    return dict(plan.mesh).get("data", 1)


@dataclasses.dataclass(frozen=True)
class Query:
    """What the planner is asked: one step of a model on ``n_devices`` devices of ``hw``.

    Attributes:
      cfg: model config (dimensions; ``dims()`` for the plan's head checks).
      hw: hardware preset (peak, bandwidths, HBM and host memory per device).
      n_devices: devices of the step.
      step: the step's sizes and dtypes.
      policies: activation policies to try.
      attention: the base attention config (kernel, blocks) every candidate starts from.
      window: sliding-window length (tokens) for the attention FLOPs, or None.
    """

    cfg: Any
    hw: Hardware
    n_devices: int
    step: StepSizes
    policies: tuple[ActivationPolicy, ...]
    attention: AttentionConfig | None = None
    window: int | None = None

    def at(self, *, n_devices: int | None = None, seq_len: int | None = None) -> Query:
        """The same question on ``n_devices`` devices and/or at ``seq_len`` tokens."""
        step = self.step if seq_len is None else dataclasses.replace(self.step, seq_len=seq_len)
        return dataclasses.replace(self, n_devices=n_devices or self.n_devices, step=step)

    def with_policies(self, policies: Sequence[ActivationPolicy]) -> Query:
        return dataclasses.replace(self, policies=tuple(policies))


def price(q: Query) -> list[Candidate]:
    """Every candidate plan of :func:`candidate_plans` priced with every policy of the query (a
    vocabulary tile count that does not divide the local sequence becomes the nearest that does)."""
    n, st = q.n_devices, q.step
    cands: list[Candidate] = []
    for plan, sharding in candidate_plans(
        q.cfg,
        n,
        st.seq_len,
        st.global_batch,
        attention=q.attention,
        packed_documents=st.packed_documents,
        window=q.window,
    ):
        # lcx.train tiles the local sequence: a tile count that does not divide it becomes the
        # nearest that does (a policy that then repeats another is priced once)
        T = st.seq_len // plan.context_degree(n)
        own: list[ActivationPolicy] = []
        for pol in q.policies:
            if pol.vocab_tiling > 1 and T % pol.vocab_tiling:
                pol = dataclasses.replace(pol, vocab_tiling=valid_tiling(pol.vocab_tiling, T))
            if pol not in own:
                own.append(pol)
        for pol in own:
            est = estimate(q.cfg, plan, q.hw, n, policy=pol, window=q.window, **st.args())
            cands.append(Candidate(plan, pol, est, sharding))
    return cands


def fits(q: Query) -> Candidate | None:
    """The fitting candidate with the smallest context degree, then the fastest (None: none fits)."""
    fit = [c for c in price(q) if c.est.fits]
    return min(fit, key=lambda c: (c.context_degree, *rank(c))) if fit else None


def rank(c: Candidate) -> tuple:
    """Sort key of candidates at one context degree: step time, then fewer offloads, fewer
    vocabulary tiles, less HBM."""
    # host transfers hidden behind compute cost no time, so among equal step times prefer fewer
    # offloads (less host memory, less PCIe traffic), then less HBM
    p = c.policy
    offloads = (p.decoder_layer_input == "offload") + (p.context == "offload") + p.offload_optimizer + p.offload_params
    return (round(c.est.step_time, 6), offloads, p.vocab_tiling, c.est.memory.total)


@dataclasses.dataclass(frozen=True)
class Recommendation:
    """The planner's answer (:func:`lcx.cost.planner.search`), in numbers
    (:func:`lcx.reports.planner.reasons` says why in words).

    Attributes:
      best: the recommended candidate (None: nothing fits).
      best_runnable: the best candidate ``lcx.train`` can run today (may equal ``best``).
      candidates: every priced candidate.
      query: what the planner was asked.
      choice: what :func:`choose` picked among the fitting candidates (None: nothing fits).
    """

    best: Candidate | None
    best_runnable: Candidate | None
    candidates: tuple[Candidate, ...]
    query: Query
    choice: Choice | None


@dataclasses.dataclass(frozen=True)
class Choice:
    """What :func:`choose` picked among the fitting candidates.

    Attributes:
      context_degree: the smallest context degree that fits.
      at: the fitting candidates at that degree, best first (:func:`rank`).
      runnable: the fitting candidates ``lcx.train`` runs today, by degree then rank.
    """

    context_degree: int
    at: tuple[Candidate, ...]
    runnable: tuple[Candidate, ...]

    @property
    def best(self) -> Candidate:
        return self.at[0]

    @property
    def best_runnable(self) -> Candidate | None:
        return self.runnable[0] if self.runnable else None


def choose(fitting: Sequence[Candidate]) -> Choice:
    """The smallest context degree among ``fitting`` (non-empty), and at it the fastest
    (:func:`rank`); the best plan lcx.train runs today besides."""
    p_min = min(c.context_degree for c in fitting)
    at = sorted((c for c in fitting if c.context_degree == p_min), key=rank)
    runnable = sorted((c for c in fitting if c.runnable_in_lcx), key=lambda c: (c.context_degree, *rank(c)))
    return Choice(p_min, tuple(at), tuple(runnable))


def estimate_dict(e: Estimate) -> dict[str, Any]:
    """An :class:`~lcx.cost.ledger.Estimate` as the plain values ``plan.json`` holds: bytes per
    device, FLOPs per step, seconds per step, the fit and the MFU (the field names say the unit)."""
    return {
        "memory_bytes_per_device": e.memory.as_dict(),
        "comm_bytes_per_device": e.comm.as_dict(),
        "model_flops_per_step": e.flops.total,
        "attention_flops_per_step": e.flops.attention,
        "recompute_flops_per_step": e.recompute_flops,
        "compute_time_s": e.compute_time,
        "comm_time_s": e.comm_time,
        "exposed_comm_time_s": e.exposed_comm_time,
        "host_bytes_per_device": e.host_bytes,
        "host_time_s": e.host_time,
        "exposed_host_time_s": e.exposed_host_time,
        "step_time_s": e.step_time,
        "kinds": [dataclasses.asdict(k) for k in e.kinds],
        "ring_block_tokens": e.ring_block,
        "ring_min_block_tokens": e.ring_min_block,
        "overlap": e.overlap,
        "fits": e.fits,
        "fits_hbm": e.fits_hbm,
        "fits_host": e.fits_host,
        "predicted_mfu": e.mfu,
        "roofline_step_time_s": e.roofline_step_time,
        "roofline_mfu": e.roofline_mfu,
        "calibrated": e.calibrated,
        "tokens_per_sec": e.tokens_per_sec,
    }
