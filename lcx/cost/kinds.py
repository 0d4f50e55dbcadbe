"""A model's layers by kind, as the ledger prices them and a plan's refusals check them.

A model's layers come in kinds (``lcx.attention.Mask.kind``: ``global``, ``sliding`` with a window
of W tokens, ``chunked`` with aligned chunks of C tokens); every layer of one kind costs the
same. :func:`layer_groups` turns a model config into one :class:`LayerGroup` per distinct layer
mask with its layer count: the ledger prices each group once and multiplies by its count
(:mod:`lcx.cost.ledger`), and :func:`lcx.attention.check_layer_kinds` asks each group's strategy
whether it can run it.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from lcx.attention.masks import Mask


@dataclasses.dataclass(frozen=True)
class LayerGroup:
    """The layers of one mask.

    Attributes:
      mask: the layers' attention mask (its ``kind``, ``window`` or ``chunk`` in tokens).
      layers: how many layers of the model have it.
    """

    mask: Mask
    layers: int

    @property
    def kind(self) -> str:
        """``global``, ``sliding`` or ``chunked`` (:attr:`lcx.attention.Mask.kind`)."""
        return self.mask.kind


def layer_groups(cfg: Any, *, window: int | None = None, chunk: int | None = None) -> tuple[LayerGroup, ...]:
    """The layers of a model config grouped by mask, in the order their kinds first appear.

    A config with ``layer_kinds`` (``lcx.models.ModelConfig``: one kind per layer, each with
    ``mask(document)``) of several kinds gives one group per distinct mask; a uniform one (one
    kind, or a plain :class:`~lcx.cost.flops.ModelDims` without ``layer_kinds``) is ``n_layers``
    layers of a causal mask with ``window`` or ``chunk`` (tokens, or None) when either is given,
    else of its one kind. ``document`` comes from the config's ``document_mask`` (default False).

    Raises:
      ValueError: ``window`` or ``chunk`` given for a model of several kinds, differing from
        them (the kinds say it; drop the argument).
    """
    document = bool(getattr(cfg, "document_mask", False))
    kinds = getattr(cfg, "layer_kinds", None)
    counts: collections.Counter = collections.Counter()
    for kind, n in collections.Counter(kinds or ()).items():  # one mask per distinct kind, not per layer
        counts[kind.mask(document)] += n
    if len(counts) <= 1 and (kinds is None or window is not None or chunk is not None):
        # uniform: n_layers layers of the mask window= / chunk= describe (a caller pricing a
        # uniform model with another window, as before layer kinds existed)
        return (LayerGroup(Mask(causal=True, document=document, window=window, chunk=chunk), int(cfg.n_layers)),)
    groups = tuple(LayerGroup(m, n) for m, n in counts.items())
    if (window is not None and any(g.mask.window != window for g in groups)) or (
        chunk is not None and any(g.mask.chunk != chunk for g in groups)
    ):
        raise ValueError(
            f"window={window}, chunk={chunk} given for a model whose layers carry their own kinds "
            f"{[(g.kind, g.mask.window or g.mask.chunk) for g in groups]}; drop them (the kinds set them)"
        )
    return groups


def scan_period(cfg: Any) -> int:
    """Layers the model's scan applies in one iteration: its pattern's period (``period_kinds``
    of ``lcx.models.ModelConfig``: Gemma 3's six), 1 for a uniform model or a plain
    :class:`~lcx.cost.flops.ModelDims`."""
    period = getattr(cfg, "period_kinds", None)
    return len(period) if period else 1
