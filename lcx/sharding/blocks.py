"""Attention block sizes: one frozen value for the four knobs (JAX splash's ``BlockSizes``).

The plan carries them (``plan.attention.block_q`` & co. in Hydra, :attr:`AttentionConfig.blocks`
in code), every kernel is built from them (:func:`lcx.attention.kernels.make_kernel`) and the
cost ledger prices them, so they live here, at the bottom of the import graph, and are checked
once, in :meth:`BlockSizes.__post_init__`. A kernel's own tiling rules (splash: multiples of 8 and
128) are the kernel's business: ``check_blocks`` of its class.
"""

from __future__ import annotations

import dataclasses

FIELDS: tuple[str, ...] = ("block_q", "block_kv", "block_q_dkv", "block_kv_dkv")
"""The field names, which are also the keys under ``plan.attention`` in Hydra."""


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Query and key/value blocks, in tokens, of an attention kernel's forward and backward.

    Named after ``jax.experimental.pallas.ops.tpu.splash_attention.BlockSizes`` (MaxText's
    ``sa_block_q`` & co.). The backward defaults to the forward: a ``*_dkv`` block left None is
    the forward's (:attr:`backward`); the None itself is kept, because splash derives its dK/dV
    query block from its dQ kernel's when ``block_q_dkv`` is None.

    Attributes:
      block_q: query block of the forward (tokens, >= 1).
      block_kv: key/value block of the forward (tokens, >= 1).
      block_q_dkv: query block of the backward (tokens, >= 1), or None: ``block_q``.
      block_kv_dkv: key/value block of the backward (tokens, >= 1), or None: ``block_kv``.

    Raises:
      ValueError: a block below 1 token (or not an integer), naming the ``plan.attention`` key.
    """

    block_q: int = 512
    block_kv: int = 512
    block_q_dkv: int | None = None
    block_kv_dkv: int | None = None

    def __post_init__(self):
        for name in FIELDS:
            b = getattr(self, name)
            optional = name.endswith("_dkv")
            if b is None and optional:
                continue
            if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                same = f" (or null: the same as plan.attention.{name.removesuffix('_dkv')})" if optional else ""
                raise ValueError(f"plan.attention.{name} must be >= 1 token{same}, got {b}")

    @property
    def backward(self) -> tuple[int, int]:
        """``(query, key/value)`` blocks of the backward in tokens: the ``*_dkv`` ones, or the
        forward's where those are None."""
        bq = self.block_q if self.block_q_dkv is None else self.block_q_dkv
        bk = self.block_kv if self.block_kv_dkv is None else self.block_kv_dkv
        return bq, bk

    def as_dict(self) -> dict[str, int | None]:
        """The four fields by their ``plan.attention`` key."""
        return {name: getattr(self, name) for name in FIELDS}
