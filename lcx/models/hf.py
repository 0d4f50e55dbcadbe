"""Import Hugging Face Llama and Mistral checkpoints (``config.json`` + ``*.safetensors``) into :class:`Llama`.

Every parameter is created directly in its shards: ``jax.make_array_from_callback`` asks, per
device, for the slice of the global array that device holds under the plan, and the callback
reads just that slice from the safetensors file(s) through ``safe_open(...).get_slice`` (which
memory-maps the file and touches only the bytes of the slice). No device and no host buffer
ever holds the whole model; the host holds one device's shard of one tensor at a time.

Name and layout mapping (Hugging Face ``LlamaForCausalLM`` -> lcx, L layers stacked on a leading
axis; ``W`` is the HF ``nn.Linear`` weight ``[out, in]``):

=============================================================  =====================================
``model.embed_tokens.weight``              ``[V, D]``           ``embed.weight [V, D]``
``model.layers.{l}.input_layernorm.weight``  ``[D]``            ``blocks.attn_norm.weight [L, D]``
``model.layers.{l}.self_attn.q_proj.weight`` ``[N*H, D]``       ``blocks.attn.wq [L, D, N, H]``
``model.layers.{l}.self_attn.k_proj.weight`` ``[K*H, D]``       ``blocks.attn.wk [L, D, K, H]``
``model.layers.{l}.self_attn.v_proj.weight`` ``[K*H, D]``       ``blocks.attn.wv [L, D, K, H]``
``model.layers.{l}.self_attn.o_proj.weight`` ``[D, N*H]``       ``blocks.attn.wo [L, N, H, D]``
``model.layers.{l}.post_attention_layernorm.weight`` ``[D]``    ``blocks.mlp_norm.weight [L, D]``
``model.layers.{l}.mlp.gate_proj.weight``  ``[F, D]``           ``blocks.mlp.w_gate [L, D, F]``
``model.layers.{l}.mlp.up_proj.weight``    ``[F, D]``           ``blocks.mlp.w_up [L, D, F]``
``model.layers.{l}.mlp.down_proj.weight``  ``[D, F]``           ``blocks.mlp.w_down [L, F, D]``
``model.norm.weight``                      ``[D]``              ``final_norm.weight [D]``
``lm_head.weight``                         ``[V, D]``           ``head [D, V]`` (absent when tied)
=============================================================  =====================================

RoPE needs no permutation: Hugging Face's Llama weights are already in the "rotate half" layout
(the conversion from Meta's interleaved checkpoints permutes q/k rows once), which pairs feature
``i`` with ``i + H/2`` exactly as :func:`lcx.models.rope` does.

Config mapping: :func:`lcx.models.hf_config.hf_config` (Llama and Mistral; every key of
``config.json`` mapped, checked to be a no-op, or refused). Export, the inverse:
:mod:`lcx.models.hf_export`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import ml_dtypes  # noqa: F401 - registers bfloat16 with NumPy, so safetensors can return BF16 slices
import numpy as np
from safetensors import safe_open

from lcx.models.config import ModelConfig
from lcx.models.hf_config import HFImportError, hf_config
from lcx.models.llama import Llama, init_model
from lcx.models.sharding import model_shardings
from lcx.sharding import MeshPlan

# names present in some checkpoints that carry no parameter (recomputed buffers)
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


# ------------------------------------------------------------------------------------------ files
class _Files:
    """Tensor name -> safetensors file, from ``model.safetensors.index.json`` or the files."""

    def __init__(self, directory: pathlib.Path):
        self.directory = directory
        index = directory / "model.safetensors.index.json"
        if index.exists():
            wm = json.loads(index.read_text())["weight_map"]
            self.where = {k: directory / v for k, v in wm.items()}
        else:
            files = sorted(directory.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors (nor model.safetensors.index.json) in {directory}")
            self.where = {}
            for f in files:
                with safe_open(f, framework="numpy") as h:
                    for k in h.keys():
                        self.where[k] = f
        self._open: dict[pathlib.Path, Any] = {}

    def handle(self, name: str):
        path = self.where[name]
        if path not in self._open:
            self._open[path] = safe_open(path, framework="numpy")
        return self._open[path]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.handle(name).get_slice(name).get_shape())

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """The slice ``index`` (one ``slice`` per stored dimension) of tensor ``name``."""
        return self.handle(name).get_slice(name)[index]


# ------------------------------------------------------------------------------------------ mapping
@dataclasses.dataclass(frozen=True)
class _Source:
    """How one lcx leaf is read from HF tensors.

    The HF tensor (2-D ``[rows, cols]`` or 1-D) is viewed as an N-d array of shape
    ``rows_shape + cols_shape``; the lcx per-layer array is that view transposed by ``perm``
    (lcx dim i = view dim ``perm[i]``).
    """

    name: str  # HF name; "{l}" is replaced by the layer
    rows_shape: tuple[int, ...]
    cols_shape: tuple[int, ...]
    perm: tuple[int, ...]
    stacked: bool  # lcx leaf has a leading layers axis


def _sources(cfg: ModelConfig) -> dict[str, _Source]:
    D, N, K, H, F, V = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.mlp_dim, cfg.vocab_size
    lay = "model.layers.{l}."
    s = {
        ".embed.weight": _Source("model.embed_tokens.weight", (V,), (D,), (0, 1), False),
        ".final_norm.weight": _Source("model.norm.weight", (D,), (), (0,), False),
        ".blocks.attn_norm.weight": _Source(lay + "input_layernorm.weight", (D,), (), (0,), True),
        ".blocks.mlp_norm.weight": _Source(lay + "post_attention_layernorm.weight", (D,), (), (0,), True),
        # [N*H, D] viewed [N, H, D] -> [D, N, H]
        ".blocks.attn.wq": _Source(lay + "self_attn.q_proj.weight", (N, H), (D,), (2, 0, 1), True),
        ".blocks.attn.wk": _Source(lay + "self_attn.k_proj.weight", (K, H), (D,), (2, 0, 1), True),
        ".blocks.attn.wv": _Source(lay + "self_attn.v_proj.weight", (K, H), (D,), (2, 0, 1), True),
        # [D, N*H] viewed [D, N, H] -> [N, H, D]
        ".blocks.attn.wo": _Source(lay + "self_attn.o_proj.weight", (D,), (N, H), (1, 2, 0), True),
        ".blocks.mlp.w_gate": _Source(lay + "mlp.gate_proj.weight", (F,), (D,), (1, 0), True),
        ".blocks.mlp.w_up": _Source(lay + "mlp.up_proj.weight", (F,), (D,), (1, 0), True),
        ".blocks.mlp.w_down": _Source(lay + "mlp.down_proj.weight", (D,), (F,), (1, 0), True),
    }
    if not cfg.tie_embeddings:
        s[".head"] = _Source("lm_head.weight", (V,), (D,), (1, 0), False)
    return s


def _read_group(idx: list[slice], shape: tuple[int, ...]) -> tuple[slice, tuple]:
    """Stored slice of a flattened group of view dims, and the sub-index to apply after reshape.

    The group's leading dim is read exactly; trailing dims are read whole and sliced afterwards
    (a contiguous byte range; it over-reads only when a trailing dim such as head_dim is itself
    sharded).
    """
    if not shape:
        return slice(None), ()
    inner = math.prod(shape[1:])
    s0 = idx[0]
    stored = slice(s0.start * inner, s0.stop * inner)
    return stored, (slice(None),) + tuple(idx[1:])


def _read_piece(files: _Files, src: _Source, layer: int | None, view_idx: list[slice]) -> np.ndarray:
    name = src.name.format(l=layer)
    nr = len(src.rows_shape)
    r_stored, r_sub = _read_group(view_idx[:nr], src.rows_shape)
    c_stored, c_sub = _read_group(view_idx[nr:], src.cols_shape)
    stored_index = (r_stored,) if not src.cols_shape else (r_stored, c_stored)
    block = files.read(name, stored_index)
    rows = view_idx[0].stop - view_idx[0].start
    shape = (rows, *src.rows_shape[1:])
    if src.cols_shape:
        cols = view_idx[nr].stop - view_idx[nr].start
        shape += (cols, *src.cols_shape[1:])
    block = block.reshape(shape)
    return block[r_sub + c_sub]


def _callback(files: _Files, src: _Source, global_shape: tuple[int, ...], dtype) -> Callable:
    def read(index: tuple[slice, ...]) -> np.ndarray:
        idx = [slice(*s.indices(n)[:2]) for s, n in zip(index, global_shape)]
        layers = range(idx[0].start, idx[0].stop) if src.stacked else [None]
        lcx_idx = idx[1:] if src.stacked else idx
        view_idx: list[slice] = [slice(0, 0)] * len(src.perm)
        for i, p in enumerate(src.perm):
            view_idx[p] = lcx_idx[i]
        pieces = [np.transpose(_read_piece(files, src, l, view_idx), src.perm).astype(dtype) for l in layers]
        return np.stack(pieces) if src.stacked else pieces[0]

    return read


def _check_names_and_shapes(files: _Files, cfg: ModelConfig, sources: Mapping[str, _Source]) -> None:
    expected: dict[str, tuple[int, ...]] = {}
    for src in sources.values():
        stored = (math.prod(src.rows_shape),) + ((math.prod(src.cols_shape),) if src.cols_shape else ())
        for l in range(cfg.n_layers) if src.stacked else [None]:
            expected[src.name.format(l=l)] = stored
    missing = sorted(set(expected) - set(files.where))
    if missing:
        hint = " (the config says tie_word_embeddings=false)" if "lm_head.weight" in missing else ""
        raise HFImportError(f"{len(missing)} tensors missing from {files.directory}: {', '.join(missing[:5])}{hint}")
    extra = sorted(k for k in set(files.where) - set(expected) if not k.endswith(_IGNORED_SUFFIXES))
    if extra:
        raise HFImportError(
            f"{len(extra)} tensors in {files.directory} have no place in lcx's Llama: {', '.join(extra[:5])}"
        )
    for name, shape in expected.items():
        got = files.shape(name)
        if got != shape:
            raise HFImportError(f"{name} has shape {list(got)} but config.json implies {list(shape)}")


def load_hf_llama(path: str | os.PathLike, plan: MeshPlan, **overrides: Any) -> tuple[Llama, ModelConfig]:
    """A Hugging Face Llama checkpoint as an lcx :class:`Llama`, sharded by ``plan``.

    Args:
      path: directory with ``config.json`` and ``*.safetensors`` (one file, or shards with
        ``model.safetensors.index.json``).
      plan: bound plan; each parameter is placed by its parameter rules
        (:func:`lcx.models.model_shardings`), each device reading only its own slice.
      **overrides: :class:`ModelConfig` fields on top of ``config.json`` (:func:`hf_config`),
        e.g. ``dtype="bfloat16"``, ``param_dtype="bfloat16"``, ``remat="full"``.

    Returns:
      ``(model, config)``: parameters in ``config.param_dtype`` (stored values cast; float32 by
      default, so BF16 checkpoints load exactly).

    Raises:
      HFImportError: unsupported config, missing / unexpected tensors, or wrong shapes; checked
        before any tensor data is read.
      PlanError: the plan cannot shard this model (e.g. a dimension its mesh axes do not divide).
      FileNotFoundError: no config.json or safetensors files.
    """
    directory = pathlib.Path(path)
    cfg = hf_config(directory, **overrides)
    plan.plan.validate(plan.n_devices, dims=cfg.dims())
    files = _Files(directory)
    sources = _sources(cfg)
    _check_names_and_shapes(files, cfg, sources)

    abstract = eqx.filter_eval_shape(init_model, cfg, key=jax.random.key(0))
    shardings = model_shardings(abstract, plan)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    sh_leaves = jax.tree.leaves(shardings)
    dtype = np.dtype(cfg.param_dtype)
    out, k = [], 0
    for p, leaf in leaves:
        name = jax.tree_util.keystr(p)
        src = sources.get(name)
        if src is None:
            raise AssertionError(f"lcx parameter {name} has no Hugging Face source")  # pragma: no cover
        sh = sh_leaves[k]
        k += 1
        out.append(jax.make_array_from_callback(leaf.shape, sh, _callback(files, src, leaf.shape, dtype)))
    return jax.tree_util.tree_unflatten(treedef, out), cfg


__all__ = ["HFImportError", "hf_config", "load_hf_llama"]
