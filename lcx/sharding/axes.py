"""Logical axis names.

Every array in lcx names its dimensions with these plain lowercase strings; a
:class:`~lcx.sharding.plan.Plan` maps each name to mesh axes, separately for
parameters and for activations (the Haliax/Levanter convention).
"""

from __future__ import annotations

BATCH = "batch"
SEQ = "seq"
HEADS = "heads"
KV_HEADS = "kv_heads"
HEAD_DIM = "head_dim"
EMBED = "embed"
MLP = "mlp"
VOCAB = "vocab"
LAYERS = "layers"

LOGICAL_AXES: tuple[str, ...] = (BATCH, SEQ, HEADS, KV_HEADS, HEAD_DIM, EMBED, MLP, VOCAB, LAYERS)
"""Every logical axis name a rule may mention."""

MESH_AXES: tuple[str, ...] = ("data", "fsdp", "tensor", "context", "ulysses", "ring")
"""Mesh axis names a plan may declare. ``context``, ``ulysses`` and ``ring`` are context-parallel
axes (the sequence is split over them); ``data`` and ``fsdp`` split the batch; ``tensor`` splits
heads and the MLP."""

CONTEXT_MESH_AXES: tuple[str, ...] = ("context", "ulysses", "ring")
