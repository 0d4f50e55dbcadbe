"""A batch of prompts checked, padded and laid out as the plan needs, on the host, before compiling.

Prompts may have different lengths. Each row is right-padded to one length ``T``: the longest
prompt rounded up to what the plan's layout needs (a multiple of P, or of 2P for zigzag and
balanced; :func:`lcx.sharding.check_layout`), and further where a layer kind's strategy runs only
longer sequences (halo, whose window or attention chunk must fit one layout chunk:
:func:`padded_length`). Padding tokens get segment id ``-1``, so no query
sees them and they see nothing (:mod:`lcx.attention.masks`); the batch is padded to a multiple of
the data degree with copies of its last row, whose outputs are dropped. Positions are
``0 .. n - 1`` per row (one document per prompt). Then the plan's layout permutes each row
(:func:`lcx.sharding.layout.row_permutations`), as the data pipeline lays out a training batch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import numpy as np

from lcx.attention import Mask, check_layer_kinds
from lcx.models.config import ModelConfig
from lcx.sharding import MeshPlan, PlanError
from lcx.sharding.layout import row_permutations


@dataclasses.dataclass(frozen=True)
class PromptBatch:
    """Prompts padded and laid out (host arrays).

    Attributes:
      tokens: int32 ``[B', T]`` laid-out token ids (padding: 0), ``B'`` the padded batch.
      positions: int32 ``[B', T]`` their global positions.
      segment_ids: int32 ``[B', T]``: 0 for a prompt token, ``-1`` for padding.
      lengths: int32 ``[B']`` prompt lengths n in tokens.
      inverse: int32 ``[B', T]``: ``inverse[b, p]`` is the laid-out index of position p.
      rows: B, the caller's rows (the first B of ``B'``).
    """

    tokens: np.ndarray
    positions: np.ndarray
    segment_ids: np.ndarray
    lengths: np.ndarray
    inverse: np.ndarray
    rows: int

    @property
    def prompt_len(self) -> int:
        return int(self.tokens.shape[1])


def as_rows(prompts: Sequence[Sequence[int] | np.ndarray] | np.ndarray) -> list[np.ndarray]:
    """The prompts as a list of int64 rows.

    Raises:
      ValueError: no prompt; an array that is not ``[B, T]`` or a row that is not 1-D; a
        non-integer dtype; an empty prompt (generation needs at least one token, e.g. BOS).
    """
    if isinstance(prompts, np.ndarray | jax.Array) and prompts.ndim != 2:
        raise ValueError(f"generate: prompts as an array must be int [batch, tokens], got shape {prompts.shape}")
    rows = [np.asarray(p) for p in prompts]
    if not rows:
        raise ValueError("generate: no prompts; give a list of int token arrays or an int32 [B, T] array")
    for i, r in enumerate(rows):
        if r.ndim != 1:
            raise ValueError(f"generate: prompt {i} must be a 1-D array of token ids, got shape {r.shape}")
        if r.size == 0:
            raise ValueError(
                f"generate: prompt {i} is empty; a prompt needs at least one token (e.g. the tokenizer's BOS id)"
            )
        if not np.issubdtype(r.dtype, np.integer):
            raise ValueError(f"generate: prompt {i} must hold integer token ids, got dtype {r.dtype}")
    return [r.astype(np.int64) for r in rows]


def check_request(rows: list[np.ndarray], cfg: ModelConfig, max_new_tokens: int) -> None:
    """Refuse what no plan can generate, before anything compiles.

    Raises:
      ValueError: ``max_new_tokens < 1``; a token id outside ``[0, vocab_size)``; a prompt plus
        ``max_new_tokens`` longer than ``rope_original_max_len`` on a model whose RoPE has no
        scaling (positions the model never saw; set ``model.rope_scaling_type``/``factor`` or
        shorten the prompt). Each message names the numbers.
    """
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"generate: max_new_tokens={max_new_tokens!r} must be a positive int (tokens per row)")
    V = cfg.vocab_size
    for i, r in enumerate(rows):
        lo, hi = int(r.min()), int(r.max())
        if lo < 0 or hi >= V:
            raise ValueError(f"generate: prompt {i} has token id {lo if lo < 0 else hi} outside [0, {V}) (vocab_size)")
    longest = max(r.size for r in rows)
    need = longest + max_new_tokens
    unscaled = [k for k in cfg.period_kinds if (r := k.rope_config(cfg.rope)) is not None and r.scaling_type is None]
    if unscaled and need > cfg.rope_original_max_len:
        raise ValueError(
            f"generate: a prompt of {longest} tokens plus max_new_tokens={max_new_tokens} reaches position {need - 1}, "
            f"beyond the model's RoPE range rope_original_max_len={cfg.rope_original_max_len} without RoPE scaling "
            f"({unscaled[0].kind} layers); shorten the prompt or use a model with rope_scaling_type llama3/yarn"
        )


def padded_length(longest: int, mesh_plan: MeshPlan, masks: Sequence[Mask] = ()) -> int:
    """The prompt length T: ``longest`` rounded up to the plan's layout chunks (P contiguous,
    2P zigzag and balanced); then, if the strategy of one of ``masks`` (the model's layer kinds)
    refuses T but runs a longer sequence, the shortest such length in whole chunks, at most
    ``chunks * max(window, chunk)``. That is halo with a short prompt: a sliding window of W needs
    W - 1 <= T / chunks (:meth:`lcx.attention.strategies.Halo.check_layer`). The padding is
    masked out (segment id -1), so it costs prefill time and cache slots, never a changed logit.

    Raises:
      PlanError: what a strategy refuses at every such length (its refusal at the longest one,
        e.g. halo for a global layer), before compiling.
    """
    P = mesh_plan.context_degree
    chunks = P * (1 if mesh_plan.plan.attention.layout == "contiguous" else 2)
    T = chunks * math.ceil(longest / chunks)
    reach = max((m.window or m.chunk or 0 for m in masks), default=0)
    refusal = None
    for t in range(T, chunks * max(T // chunks, reach) + 1, chunks):
        try:
            check_layer_kinds(masks, mesh_plan.plan, mesh_plan.n_devices, t)
            return t
        except PlanError as e:
            refusal = e
    assert refusal is not None  # the range holds T
    raise refusal


def prepare(rows: list[np.ndarray], mesh_plan: MeshPlan, masks: Sequence[Mask] = ()) -> PromptBatch:
    """Pad and lay out checked prompts (:func:`as_rows`, :func:`check_request`) for ``mesh_plan``
    and a model of layer ``masks`` (:func:`padded_length`).

    Raises:
      PlanError: a layer kind the plan's strategy cannot run at any padded length.
    """
    plan = mesh_plan.plan
    data = math.prod(dict(mesh_plan.mesh.shape)[a] for a in plan.batch_axes)
    B = len(rows)
    Bp = data * math.ceil(B / data)
    rows = rows + [rows[-1]] * (Bp - B)
    T = padded_length(max(r.size for r in rows), mesh_plan, masks)
    lengths = np.array([r.size for r in rows], np.int32)
    tokens = np.zeros((Bp, T), np.int64)
    for b, r in enumerate(rows):
        tokens[b, : r.size] = r
    positions = np.broadcast_to(np.arange(T), (Bp, T))
    segment_ids = np.where(positions < lengths[:, None], 0, -1)
    att = plan.attention
    perm = row_permutations(
        att.layout, positions, segment_ids, mesh_plan.context_degree, block=max(att.block_q, att.block_kv)
    )
    inverse = np.argsort(perm, axis=1)
    take = lambda x: np.take_along_axis(x, perm, axis=1).astype(np.int32)
    return PromptBatch(take(tokens), take(positions), take(segment_ids), lengths, inverse.astype(np.int32), B)


__all__ = ["PromptBatch", "as_rows", "check_request", "padded_length", "prepare"]
