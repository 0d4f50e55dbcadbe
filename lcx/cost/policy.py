"""What the backward pass finds saved, and where: the activation policy the ledger prices.

The remat vocabulary is ``lcx.models``' (:data:`REMAT_POLICIES`, defined once in
:mod:`lcx.models.config`) and MaxText's per-tensor placements (``decoder_layer_input`` /
``context`` ``device | offload | remat``, MaxText ``base.yml``); host offload moves saved
tensors to host memory. :meth:`ActivationPolicy.from_model` reads the policy ``lcx.models`` runs
from a model config.
"""

from __future__ import annotations

import dataclasses

from lcx.models.config import REMAT_POLICIES as REMAT_POLICIES

PLACEMENTS: tuple[str, ...] = ("device", "offload", "remat")
"""Where ``custom`` keeps a named tensor: on device, offloaded to host, or recomputed."""


@dataclasses.dataclass(frozen=True)
class ActivationPolicy:
    """What the backward pass finds saved, and where.

    Attributes:
      remat: one of :data:`REMAT_POLICIES`.
      decoder_layer_input: placement of each block's input ``[b, T, D]`` (``device`` or
        ``offload``; MaxText ``decoder_layer_input``). Every policy but ``none`` keeps it.
      context: ``custom`` only: placement of the flash-attention residuals, the float32 output
        ``[b, T, N, H]`` and logsumexp ``[b, T, N]`` (MaxText ``context``, ``lcx.models``
        ``remat_context``): ``device``/``offload`` keep them (attention is not replayed),
        ``remat`` replays it.
      offload_optimizer: optimizer state in host memory between steps (MaxText
        ``optimizer_memory_host_offload``; ``lcx.train``'s ``memory.offload_optimizer``): copied
        to the device for the update only.
      offload_params: parameters in host memory between steps (MaxText
        ``parameter_memory_host_offload``; ``memory.offload_params``): copied to the device at
        the start of the step, where they stay until the update.
      vocab_tiling: tiles N of the local sequence the output head and loss are computed in
        (MaxText ``num_vocab_tiling``; ``memory.vocab_tiling``,
        ``lcx.training.loss.vocab_tiled_loss_sum_and_count``); 1: the logits are computed whole.
      qkv: ``custom`` only: placement of q ``[b, T, N, H]`` and k, v ``[b, T, K, H]`` after RoPE
        (``lcx.models`` ``remat_qkv``): ``device``/``offload`` keep them, ``remat`` replays the
        norm, projections and RoPE that make them.
    """

    remat: str = "full"
    decoder_layer_input: str = "device"
    context: str = "remat"
    offload_optimizer: bool = False
    offload_params: bool = False
    vocab_tiling: int = 1
    qkv: str = "remat"

    def __post_init__(self):
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"unknown remat policy {self.remat!r}; choose one of {REMAT_POLICIES}")
        if self.decoder_layer_input not in ("device", "offload"):
            raise ValueError(f"decoder_layer_input must be 'device' or 'offload', got {self.decoder_layer_input!r}")
        if self.context not in PLACEMENTS:
            raise ValueError(f"context must be one of {PLACEMENTS}, got {self.context!r}")
        if self.qkv not in PLACEMENTS:
            raise ValueError(f"qkv must be one of {PLACEMENTS}, got {self.qkv!r}")
        n = self.vocab_tiling
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"vocab_tiling must be a whole number >= 1 (1: untiled), got {n!r}")

    @classmethod
    def from_model(cls, cfg, **overrides) -> ActivationPolicy:
        """The policy a model config trains with: ``model.remat`` and, for ``custom``, its
        placements ``model.remat_layer_input``, ``model.remat_context``, ``model.remat_qkv``
        (:class:`lcx.models.ModelConfig`; a config without them gets the defaults).

        Args:
          cfg: a model config.
          overrides: fields to set instead (e.g. ``offload_optimizer=True``, or a remat policy
            the model does not run, to price it).

        Raises:
          ValueError: an unknown policy or placement.
        """
        fields = dict(
            remat=cfg.remat,
            decoder_layer_input=getattr(cfg, "remat_layer_input", "device"),
            context=getattr(cfg, "remat_context", "remat"),
            qkv=getattr(cfg, "remat_qkv", "remat"),
        )
        return cls(**{**fields, **overrides})

    @property
    def keeps_context(self) -> bool:
        return self.remat == "custom" and self.context != "remat"

    @property
    def label(self) -> str:
        parts = [self.remat]
        if self.decoder_layer_input == "offload":
            parts.append("in>host")
        if self.remat == "custom":
            parts.append(f"ctx={self.context}")
            if self.qkv != "remat":
                parts.append(f"qkv={self.qkv}")
        if self.offload_optimizer:
            parts.append("opt>host")
        if self.offload_params:
            parts.append("par>host")
        if self.vocab_tiling > 1:
            parts.append(f"vt{self.vocab_tiling}")
        return ",".join(parts)
