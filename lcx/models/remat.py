"""Rematerialisation of the scanned decoder layers: ``jax.checkpoint`` policies by name.

:func:`remat_policy` turns a :data:`~lcx.models.config.REMAT_POLICIES` name (and, for
``custom``, the placement of each named tensor) into the policy :class:`lcx.models.Llama` wraps
each layer in; :data:`REMAT_NAMES` lists the ``checkpoint_name`` tags each placement applies to.
"""

from __future__ import annotations

import jax

from lcx.attention.names import CONTEXT

REMAT_NAMES: dict[str, tuple[str, ...]] = {
    "remat_layer_input": ("decoder_layer_input",),
    "remat_qkv": ("query", "key", "value"),
    "remat_context": (CONTEXT,),
}
"""``checkpoint_name`` tags each ``model.remat_*`` placement (``remat: custom``) applies to: the
block input (MaxText's name), q/k/v after RoPE, and the flash residuals (out and logsumexp,
tagged inside attention's custom VJP, :mod:`lcx.attention.names`)."""


def remat_policy(name: str, **placements: str):
    """The ``jax.checkpoint`` policy for a :data:`~lcx.models.config.REMAT_POLICIES` name.

    Args:
      name: the policy.
      placements: ``custom`` only: ``remat_layer_input``, ``remat_qkv``, ``remat_context`` ->
        ``device | offload | remat`` (omitted: not saved). Tensors placed ``offload`` are copied
        to ``pinned_host`` memory in the forward and back to the device in the backward
        (``jax.checkpoint_policies.save_and_offload_only_these_names``).

    Returns:
      None for ``"full"`` (save nothing but the block inputs), a policy callable otherwise.

    Raises:
      ValueError: ``"none"`` (no checkpointing, so no policy), an unknown name, placement key or
        placement, or placements with a policy other than ``custom``.
    """
    policies = {
        "full": None,
        # and the flash output and logsumexp: the custom VJP's residuals are no dots, so the
        # backward would rebuild them from the kernel's saved logits tiles, O(S^2 / P) bytes
        "dots_saveable": jax.checkpoint_policies.save_from_both_policies(
            jax.checkpoint_policies.dots_saveable, jax.checkpoint_policies.save_only_these_names(CONTEXT)
        ),
        "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        "custom": None,
    }
    if name not in policies:
        raise ValueError(f"no checkpoint policy for remat={name!r}; choose one of {sorted(policies)}")
    if name != "custom":
        if placements:
            raise ValueError(f"placements {sorted(placements)} need remat='custom', got remat={name!r}")
        return policies[name]
    saved, offloaded = [], []
    for key, where in placements.items():
        if key not in REMAT_NAMES or where not in ("device", "offload", "remat"):
            raise ValueError(f"placement {key}={where!r}: keys {sorted(REMAT_NAMES)}, values device|offload|remat")
        {"device": saved, "offload": offloaded, "remat": []}[where].extend(REMAT_NAMES[key])
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=saved,
        names_which_can_be_offloaded=offloaded,
        offload_src="device",
        offload_dst="pinned_host",
    )


__all__ = ["REMAT_NAMES", "remat_policy"]
