"""Per-device memory of one training step, by component and phase: the ledger's totals.

Combines the state under the plan's parameter sharding (:func:`lcx.sharding.describe.layout_arrays`
of :func:`~lcx.cost.activations.param_arrays`), the saved activations of the policy
(:mod:`lcx.cost.activations`) and one attention layer's strategy and kernel buffers
(:mod:`lcx.cost.attention_memory`, priced by the plan's registered strategy and kernel classes)
into a :class:`MemoryBreakdown`.

Where the compiler puts what (``memory_breakdown(..., memory_kinds=...)``): an accelerator
compiler (TPU, GPU: XLA's host-offload passes) honours JAX's memory kinds, so offloaded tensors
live in ``pinned_host`` memory and ``lcx.training.step``'s ``jax.device_put`` calls are copies
into HBM. XLA:CPU runs ``strip-memory-placement-annotations`` instead: no copy is made,
``pinned_host`` arguments (``S(5)`` in the compiled module's ``entry_computation_layout``) are
read in place and tensors the remat policy offloads stay ordinary temporaries.
``memory_kinds=False`` prices that program.
"""

from __future__ import annotations

import dataclasses
from typing import Unpack

from lcx.attention.kernels import get_kernel
from lcx.cost.activations import (
    attention_residual_bytes_per_token,
    layer_working_bytes_per_token,
    logits_phase_bytes,
    param_arrays,
    saved_bytes_per_token_per_layer,
)
from lcx.cost.attention_memory import layer_backward_bytes, layer_forward_bytes, layer_prologue_bytes
from lcx.cost.dtypes import dtype_bytes
from lcx.cost.flops import ModelDims
from lcx.cost.kinds import scan_period
from lcx.cost.local import LocalStep, StepArgs, StepSizes, frozen_cache
from lcx.cost.policy import ActivationPolicy
from lcx.sharding import Plan
from lcx.sharding.describe import ArrayLayout, layout_arrays


@dataclasses.dataclass(frozen=True)
class MemoryBreakdown:
    """Per-device memory of one training step, by component, in bytes.

    The peak is counted as phases of the step, because the transients of different phases are
    never live together: ``state + max(activations + max(layer_working, attention, logits,
    attention_forward), update)``.

    - state (parameters, gradients, optimizer) and the saved activations live throughout;
    - ``attention_forward``: an attention layer's forward (its strategy's buffers and the
      kernel's forward tiles; the peak only when the forward's blocks exceed the backward's);
    - ``logits``: the loss phase (after the layer scan's forward, before its backward);
    - ``layer_working``: the MLP phase of one block's backward, when all of that block's
      residuals are live (:func:`layer_working_bytes_per_token`), and so are the attention
      backward's cotangent-independent buffers (:func:`~lcx.cost.attention_memory.attention_prologue_bytes`);
    - ``attention``: the attention phase of the same block's backward (the MLP's residuals are
      dead): the residuals attention still reads
      (:func:`attention_residual_bytes_per_token`) plus its strategy's and kernel's backward
      (:func:`~lcx.cost.attention_memory.attention_working_bytes`);
    - ``update``: the optimizer update, after the backward (the saved activations are dead):
      with the optimizer state offloaded, its device copy (``lcx.training.step`` puts it on the
      device right before ``optimizer.update``).

    Attributes:
      params, grads, optimizer: state under the plan's parameter sharding on device during the
        forward and backward. Offloaded parameters are on device then too (the step copies them
        in at its start), unless the compiler strips memory kinds (XLA:CPU reads them in
        place); offloaded optimizer state is not (0; see ``update`` and ``host``).
      activations: saved activations of all layers kept on device.
      layer_working: the MLP phase's transient.
      attention: the attention phase's transient.
      logits: the loss phase's transient (:func:`logits_phase_bytes`: four float32
        ``[b, T / vocab_tiling, V]`` tiles, the gathered head, the final norm's residuals).
      host: bytes per device in host memory (offloaded activations, optimizer, parameters).
      attention_forward: the forward phase's transient: one attention layer's forward
        (:func:`~lcx.cost.attention_memory.attention_forward_bytes`), on top of the saved
        activations (all layers' at the last layer, an upper bound).
      update: the update phase's bytes beyond ``state``: the offloaded optimizer state's device
        copy (0 without optimizer offload, or when the compiler strips memory kinds).
    """

    params: int
    grads: int
    optimizer: int
    activations: int
    layer_working: int
    attention: int
    logits: int
    host: int
    attention_forward: int = 0
    update: int = 0

    @property
    def state(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def working(self) -> int:
        """The largest phase's transient (the phases are not live together)."""
        return max(self.layer_working, self.attention, self.logits, self.attention_forward)

    @property
    def total(self) -> int:
        """Peak HBM per device: state + the larger of (saved activations + the largest backward
        or forward phase's transient) and the update phase's bytes."""
        return self.state + max(self.activations + self.working, self.update)

    def as_dict(self) -> dict[str, int]:
        d = dataclasses.asdict(self)
        d["total"] = self.total
        return d


@frozen_cache
def param_layout(
    plan: Plan, n_devices: int, cfg: ModelDims, param_dtype: str = "float32", *, tie_embeddings: bool = False
) -> tuple[ArrayLayout, ...]:
    """Every parameter array of ``cfg`` laid out under the plan's parameter rules on ``n_devices``
    (:func:`lcx.sharding.describe.layout_arrays`). Cached: the planner prices one plan under many
    activation policies, and the layout depends on none of them (:func:`~lcx.cost.local.frozen_cache`).

    Raises:
      PlanError: the plan's mesh does not fit ``n_devices``.
    """
    return tuple(layout_arrays(plan, n_devices, param_arrays(cfg, param_dtype, tie_embeddings=tie_embeddings)))


def param_bytes_per_device(
    plan: Plan, n_devices: int, cfg: ModelDims, param_dtype: str = "float32", *, tie_embeddings: bool = False
) -> int:
    """Bytes of parameters per device under the plan's parameter rules (ceil-divided shards)."""
    return sum(
        r.bytes_per_device for r in param_layout(plan, n_devices, cfg, param_dtype, tie_embeddings=tie_embeddings)
    )


def memory_breakdown(
    cfg: ModelDims,
    plan: Plan,
    n_devices: int,
    *,
    policy: ActivationPolicy,
    optimizer_states: int = 2,
    memory_kinds: bool = True,
    window: int | None = None,
    **step: Unpack[StepArgs],
) -> MemoryBreakdown:
    """Per-device memory of a training step for ``cfg`` under ``plan`` on ``n_devices``.

    Host offload of state, as ``lcx.training.step.make_steps`` compiles it
    (``memory.offload_params`` / ``memory.offload_optimizer``): between steps the offloaded
    parameters / optimizer state are ``pinned_host`` arguments and outputs of the step (``host``,
    each under the plan's parameter sharding). Inside the step the parameters are put on the
    device at its start and stay there until the update (``params`` is unchanged by the
    offload); the optimizer state is put on the device after the backward, for the update only
    (``optimizer`` 0, ``update`` its device copy). With ``memory_kinds=False`` (XLA:CPU, whose
    ``strip-memory-placement-annotations`` pass removes every placement) no copy exists: the
    step reads the ``pinned_host`` arguments in place (``params`` 0 when offloaded, ``update``
    0) and the activations the remat policy offloads stay ordinary temporaries (counted in
    ``activations``, not ``host``).

    Args:
      cfg: model dimensions.
      plan: the sharding plan (mesh sizes resolved for ``n_devices``).
      policy: remat / offload / vocabulary-tiling choices.
      optimizer_states: optimizer tensors per parameter (AdamW: mu and nu = 2; optax keeps them
        in the parameter dtype).
      memory_kinds: whether the compiler honours JAX memory kinds (TPU, GPU: True). False prices
        the program XLA:CPU compiles: placements stripped (above), and its fusion of the loss
        backward on tiles of 4,096 tokens or more (:func:`logits_phase_bytes` ``xla_cpu``).
      window: a uniform model's sliding window in tokens (:func:`~lcx.cost.kinds.layer_groups`).
      **step: the step's sizes and dtypes (:class:`~lcx.cost.local.StepArgs`: ``seq_len``,
        ``global_batch``, ``dtype``, ``param_dtype``, ``tie_embeddings``).

    Layer kinds (a model of several, each run by the strategy the plan gives it): the
    transients of one layer's phases are the largest over the kinds (one layer is differentiated
    at a time), the residuals every layer saves are summed over the kinds by their layer counts.

    Raises:
      PlanError: the plan's mesh does not fit ``n_devices``, or gives a kind no strategy.
    """
    st = StepSizes(**step)
    dtype, param_dtype, tie_embeddings = st.dtype, st.param_dtype, st.tie_embeddings
    local = LocalStep.of(cfg, plan, n_devices, st, window=window)
    tokens = local.tokens
    layout = param_layout(plan, n_devices, cfg, param_dtype, tie_embeddings=tie_embeddings)
    p = sum(r.bytes_per_device for r in layout)
    dev_tok, host_tok = saved_bytes_per_token_per_layer(cfg, policy, dtype)
    if not memory_kinds:  # XLA:CPU: offloaded residuals are ordinary temporaries
        dev_tok, host_tok = dev_tok + host_tok, 0
    acts = cfg.n_layers * tokens * dev_tok
    host = cfg.n_layers * tokens * host_tok
    opt = optimizer_states * p
    # offloaded parameters: copied in at the step's start and held until the update (read in
    # place from the pinned_host argument where memory kinds are stripped)
    params_dev = 0 if policy.offload_params and not memory_kinds else p
    opt_dev = 0 if policy.offload_optimizer else opt
    update = opt if policy.offload_optimizer and memory_kinds else 0
    host += (p if policy.offload_params else 0) + (opt if policy.offload_optimizer else 0)
    # the loss phase reads a copy of the head when its parameter is sharded (all-gathered) or cast
    head = next(r for r in layout if r.info.name == ("embed" if tie_embeddings else "head"))
    head_copy = head.bytes_per_device < head.global_bytes or dtype_bytes(dtype) != dtype_bytes(param_dtype)
    blocks, kernel = plan.attention.blocks, get_kernel(plan.attention.kernel)
    # per layer kind (its strategy's call): the attention call's residuals beyond the local q/k/v
    # (gathered K/V, post-all-to-all k/v) and the phases' transients; with remat: none every layer
    # saves its residuals, otherwise the replay rebuilds them for the block being differentiated,
    # live in both of its backward phases
    res = [k.strategy.residual_bytes(k.attention) for k in local.kinds]
    if policy.remat == "none":
        # saved by every layer; the block being differentiated copies its slices out of the stacks
        # (see layer_working_bytes_per_token), so they are ALSO live in both backward phases
        for k, r in zip(local.kinds, res):
            acts += k.layers * r
            if k.strategy.output_all_to_all and dtype_bytes(dtype) == 4:
                # the output returns through an all-to-all: the float32 flash output is in head
                # layout, so the sequence-layout output ``wo`` reads is a second saved array (in
                # 16-bit it is the cast the ``none`` set already counts)
                acts += k.layers * tokens * cfg.n_heads // local.tensor_degree * cfg.head_dim * 4
    prologue = max(r + layer_prologue_bytes(k.strategy, kernel, k.attention) for k, r in zip(local.kinds, res))
    att = max(r + layer_backward_bytes(k.strategy, kernel, k.attention, blocks) for k, r in zip(local.kinds, res))
    att_fwd = max(layer_forward_bytes(k.strategy, kernel, k.attention, blocks) for k in local.kinds)
    # a scan iteration differentiates a whole pattern period: the residuals of its other P - 1
    # layers (sliced from the stacks with remat none, rebuilt by replays XLA starts early
    # otherwise) are live in the backward phases too (measured: tests/test_cost_compiled.py)
    period = (scan_period(cfg) - 1) * tokens * saved_bytes_per_token_per_layer(cfg, ActivationPolicy("none"), dtype)[0]
    logits = logits_phase_bytes(
        cfg, tokens=tokens, vocab_tiling=policy.vocab_tiling, head_copy=head_copy, dtype=dtype, xla_cpu=not memory_kinds
    )
    return MemoryBreakdown(
        params=params_dev,
        grads=p,
        optimizer=opt_dev,
        activations=acts,
        layer_working=tokens * layer_working_bytes_per_token(cfg, policy, dtype) + prologue + period,
        attention=tokens * attention_residual_bytes_per_token(cfg, policy, dtype) + att + period,
        logits=logits,
        host=host,
        attention_forward=att_fwd,
        update=update,
    )
