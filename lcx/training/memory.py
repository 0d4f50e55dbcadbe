"""What ``lcx.train`` does to fit a step in device memory beyond remat: the ``memory:`` section.

- ``memory.vocab_tiling``: the output head and loss in tiles of the local sequence
  (:func:`lcx.training.loss.vocab_tiled_loss_sum_and_count`; MaxText ``num_vocab_tiling``).
- ``memory.offload_optimizer``: AdamW's moments live in ``pinned_host`` memory between steps
  (MaxText ``optimizer_memory_host_offload``).
- ``memory.offload_params``: the float32 master parameters live in ``pinned_host`` memory
  between steps (MaxText ``parameter_memory_host_offload``).

Offloaded arrays keep the plan's sharding; only their JAX memory kind changes (JAX's "Memories
and host offloading" guide). The jitted step copies them to the device where it needs them and
its outputs return to the host (:mod:`lcx.training.step`).

``lcx.plan`` reads the same section, plus the keys it alone prices (``memory.remat``,
``.decoder_layer_input``, ``.context``, ``.qkv``: policies other than the model's own); lcx.train
trains the model's own policy (``model.remat`` and its placements) and refuses those keys when
they are set, instead of ignoring them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

HOST = "pinned_host"
DEVICE = "device"

PLAN_ONLY_KEYS = {
    "remat": "model.remat",
    "decoder_layer_input": "model.remat_layer_input",
    "context": "model.remat_context",
    "qkv": "model.remat_qkv",
}
"""``memory.*`` keys only ``lcx.plan`` reads (to price a policy the model does not run) and the
``model.*`` key ``lcx.train`` reads instead."""


def _tiling_error(n: Any) -> ValueError:
    return ValueError(
        f"memory.vocab_tiling={n!r}: must be a whole number >= 1 (tiles of the local sequence "
        "the output head and loss are computed in; 1: untiled)"
    )


@dataclasses.dataclass(frozen=True)
class MemoryOptions:
    """The ``memory:`` section of an ``lcx.train`` config.

    Attributes:
      vocab_tiling: tiles N the local sequence of the output head and loss is split into (1: the
        logits ``[b, T, V]`` are computed whole). N must divide the local sequence ``T``.
      offload_optimizer: optimizer state in ``pinned_host`` memory between steps.
      offload_params: parameters in ``pinned_host`` memory between steps.
    """

    vocab_tiling: int = 1
    offload_optimizer: bool = False
    offload_params: bool = False

    def __post_init__(self):
        n = self.vocab_tiling
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise _tiling_error(n)
        for name in ("offload_optimizer", "offload_params"):
            v = getattr(self, name)
            if not isinstance(v, bool):
                raise ValueError(
                    f"memory.{name}={v!r}: must be true or false; write memory.{name}=true or memory.{name}=false"
                )

    @classmethod
    def from_config(cls, node: Mapping[str, Any] | None) -> MemoryOptions:
        """Options from a config's ``memory`` section (None or missing keys: the defaults).

        Raises:
          ValueError: an unknown key (names the known ones), a plan-only key that is set (names the
            ``model.*`` key to set instead), or a value of the wrong type.
        """
        if node is None:
            return cls()
        d = dict(node.items()) if hasattr(node, "items") else dict(node)
        fields = {f.name for f in dataclasses.fields(cls)}
        for k, v in d.items():
            if k in PLAN_ONLY_KEYS:
                if v is not None:
                    raise ValueError(
                        f"memory.{k}={v!r} is read by lcx.plan only (to price a policy the model does "
                        f"not run); lcx.train trains the model's own: set {PLAN_ONLY_KEYS[k]} instead"
                    )
            elif k not in fields:
                import difflib  # noqa: PLC0415

                near = difflib.get_close_matches(k, sorted(fields) + sorted(PLAN_ONLY_KEYS), n=1, cutoff=0.6)
                hint = f"did you mean memory.{near[0]}? " if near else ""
                raise ValueError(
                    f"memory.{k}: unknown key; {hint}lcx.train reads memory.{', memory.'.join(sorted(fields))}"
                )
        vt = d.get("vocab_tiling", 1)
        if isinstance(vt, float) and vt.is_integer():
            vt = int(vt)
        if not isinstance(vt, int):
            raise _tiling_error(vt)
        return cls(
            vocab_tiling=vt,
            offload_optimizer=d.get("offload_optimizer", False),
            offload_params=d.get("offload_params", False),
        )

    def check_tiling(
        self, local_seq_len: int, *, seq_len: int | None = None, context_degree: int | None = None
    ) -> None:
        """Refuse a ``vocab_tiling`` that does not divide the local sequence ``local_seq_len``.

        Raises:
          ValueError: names the value, the local sequence and the nearest valid tile counts.
        """
        n, t = self.vocab_tiling, local_seq_len
        if t % n == 0:
            return
        from lcx.cost.planner import divisors  # noqa: PLC0415 - keep this config module free of JAX

        divs = divisors(t)
        best = min(divs, key=lambda d: (abs(d - n), d))
        lower = max((d for d in divs if d < n), default=None)
        upper = min((d for d in divs if d > n), default=None)
        near = sorted({x for x in (lower, upper) if x is not None})
        where = (
            f" (train.seq_len={seq_len:,} / context degree {context_degree})"
            if seq_len is not None and context_degree is not None
            else ""
        )
        raise ValueError(
            f"memory.vocab_tiling={n} does not divide the local sequence of {t:,} tokens{where}: each tile is "
            f"{t:,} / N tokens of every device's shard; the nearest valid N is {best}"
            + (f" (valid neighbours: {', '.join(map(str, near))})" if len(near) > 1 else "")
            + f": use memory.vocab_tiling={best}"
        )

    @property
    def any_offload(self) -> bool:
        return self.offload_optimizer or self.offload_params


def with_memory_kind(shardings: Any, kind: str) -> Any:
    """A pytree of ``jax.sharding.Sharding`` with every leaf moved to memory ``kind``
    (:data:`HOST` or :data:`DEVICE`); the partitioning is unchanged."""
    import jax  # noqa: PLC0415 - this module is read by config code that needs no JAX

    return jax.tree.map(
        lambda s: s.with_memory_kind(kind), shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding)
    )


__all__ = ["DEVICE", "HOST", "MemoryOptions", "PLAN_ONLY_KEYS", "with_memory_kind"]
