"""Import Hugging Face checkpoints (``config.json`` + ``*.safetensors``) of the families of
:mod:`lcx.models.hf_families` (Llama, Mistral, Qwen2.5, Qwen3, Gemma 3) into lcx's decoder
(:class:`Llama`): :func:`from_pretrained`.

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
``model.layers.{l}.self_attn.q_proj.bias``   ``[N*H]``          ``blocks.attn.bq [L, N, H]`` (Qwen2.5)
``model.layers.{l}.self_attn.k_proj.bias``   ``[K*H]``          ``blocks.attn.bk [L, K, H]`` (Qwen2.5)
``model.layers.{l}.self_attn.v_proj.bias``   ``[K*H]``          ``blocks.attn.bv [L, K, H]`` (Qwen2.5)
``model.layers.{l}.self_attn.q_norm.weight`` ``[H]``            ``blocks.attn.q_norm.weight [L, H]``
``model.layers.{l}.self_attn.k_norm.weight`` ``[H]``            ``blocks.attn.k_norm.weight [L, H]``
=============================================================  =====================================

With ``post_norms`` (Gemma 3) ``post_attention_layernorm`` is the attention output's norm
(``blocks.attn_post_norm``), and ``pre_feedforward_layernorm`` / ``post_feedforward_layernorm``
are ``blocks.mlp_norm`` / ``blocks.mlp_post_norm``. Gemma's ``(1 + w)`` gains are stored as
``w`` on both sides (``ModelConfig.norm_gain_offset``). A multimodal Gemma 3 checkpoint keeps the
language model under ``model.language_model.`` (transformers 5) or ``language_model.model.``
(the original checkpoints); its vision tensors are not read.

RoPE needs no permutation: Hugging Face's Llama weights are already in the "rotate half" layout
(the conversion from Meta's interleaved checkpoints permutes q/k rows once), which pairs feature
``i`` with ``i + H/2`` exactly as :func:`lcx.models.rope` does.

Config mapping: :func:`lcx.models.hf_config.hf_config` (every key of ``config.json`` mapped,
checked to be a no-op, or refused). Export, the inverse:
:mod:`lcx.models.hf_export`.
"""

from __future__ import annotations

import dataclasses
import functools
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
from lcx.models.hf_config import HFImportError, hf_config, read_config, text_model
from lcx.models.hf_families import Multimodal
from lcx.models.llama import Llama, init_model
from lcx.models.sharding import model_shardings
from lcx.sharding import MeshPlan, Plan, bind

STORED_DTYPES: tuple[str, ...] = ("F32", "BF16", "F16")
"""safetensors dtypes lcx reads parameters from: each value is exact in float32. Integer and 8-bit
float tensors (quantized checkpoints) and F64 (rounded by float32) are refused, naming the tensor."""

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
            absent = sorted({v for v in wm.values() if not (directory / v).is_file()})
            if absent:
                names = sorted(k for k, v in wm.items() if v == absent[0])
                raise HFImportError(
                    f"model.safetensors.index.json in {directory} names shard(s) {absent} that are not there "
                    f"({absent[0]} holds {len(names)} tensors, e.g. {names[0]}); copy the whole checkpoint"
                )
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

    def dtype(self, name: str) -> str:
        """The stored safetensors dtype (``F32``, ``BF16``, ``F16``, ``I8``, ``F8_E4M3``, ...)."""
        return str(self.handle(name).get_slice(name).get_dtype())

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
    """lcx leaf path -> its Hugging Face tensor, for the family options of ``cfg`` (module table)."""
    D, N, K, H, F, V = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.mlp_dim, cfg.vocab_size
    lay = "model.layers.{l}."
    s = {
        ".embed.weight": _Source("model.embed_tokens.weight", (V,), (D,), (0, 1), False),
        ".final_norm.weight": _Source("model.norm.weight", (D,), (), (0,), False),
        ".blocks.attn_norm.weight": _Source(lay + "input_layernorm.weight", (D,), (), (0,), True),
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
    norm = functools.partial(_Source, rows_shape=(D,), cols_shape=(), perm=(0,), stacked=True)
    if cfg.post_norms:  # Gemma 2/3: post_attention_layernorm is the attention output's norm
        s[".blocks.attn_post_norm.weight"] = norm(lay + "post_attention_layernorm.weight")
        s[".blocks.mlp_norm.weight"] = norm(lay + "pre_feedforward_layernorm.weight")
        s[".blocks.mlp_post_norm.weight"] = norm(lay + "post_feedforward_layernorm.weight")
    else:  # Llama: post_attention_layernorm is the MLP's input norm
        s[".blocks.mlp_norm.weight"] = norm(lay + "post_attention_layernorm.weight")
    if cfg.attention_bias:  # [N*H] viewed [N, H]
        s[".blocks.attn.bq"] = _Source(lay + "self_attn.q_proj.bias", (N, H), (), (0, 1), True)
        s[".blocks.attn.bk"] = _Source(lay + "self_attn.k_proj.bias", (K, H), (), (0, 1), True)
        s[".blocks.attn.bv"] = _Source(lay + "self_attn.v_proj.bias", (K, H), (), (0, 1), True)
    if cfg.qk_norm:
        s[".blocks.attn.q_norm.weight"] = _Source(lay + "self_attn.q_norm.weight", (H,), (), (0,), True)
        s[".blocks.attn.k_norm.weight"] = _Source(lay + "self_attn.k_norm.weight", (H,), (), (0,), True)
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


def _check_names_and_shapes(
    files: _Files, cfg: ModelConfig, sources: Mapping[str, _Source], other: tuple[str, ...] = ()
) -> None:
    expected: dict[str, tuple[int, ...]] = {}
    for src in sources.values():
        stored = (math.prod(src.rows_shape),) + ((math.prod(src.cols_shape),) if src.cols_shape else ())
        for l in range(cfg.n_layers) if src.stacked else [None]:
            expected[src.name.format(l=l)] = stored
    missing = sorted(set(expected) - set(files.where))
    if missing:
        hint = (
            " (the config says tie_word_embeddings=false)" if any(m.endswith("lm_head.weight") for m in missing) else ""
        )
        raise HFImportError(f"{len(missing)} tensors missing from {files.directory}: {', '.join(missing[:5])}{hint}")
    extra = sorted(
        k for k in set(files.where) - set(expected) if not k.endswith(_IGNORED_SUFFIXES) and not k.startswith(other)
    )
    if extra:
        raise HFImportError(
            f"{len(extra)} tensors in {files.directory} have no place in lcx's {cfg.name} model: {', '.join(extra[:5])}"
        )
    for name, shape in expected.items():
        got = files.shape(name)
        if got != shape:
            raise HFImportError(f"{name} has shape {list(got)} but config.json implies {list(shape)}")
        dtype = files.dtype(name)
        if dtype not in STORED_DTYPES:
            raise HFImportError(
                f"{name} is stored as {dtype}, which lcx does not load: parameters are read from "
                f"{'/'.join(STORED_DTYPES)} (each exact in float32); dequantize or convert the checkpoint first"
            )


def _language_model(files: _Files, sources: dict[str, _Source], mm: Multimodal) -> dict[str, _Source]:
    """``sources`` renamed to where a multimodal checkpoint keeps its language model."""
    for prefix, head in mm.prefixes:
        if prefix + "embed_tokens.weight" in files.where:
            return {
                p: dataclasses.replace(
                    s, name=head if s.name == "lm_head.weight" else prefix + s.name.removeprefix("model.")
                )
                for p, s in sources.items()
            }
    tried = ", ".join(p + "embed_tokens.weight" for p, _ in mm.prefixes)
    raise HFImportError(f"{files.directory} holds no language model: none of {tried}")


def single_device_plan() -> MeshPlan:
    """The plan of ``plan=None``: one device (the first), everything replicated."""
    return bind(Plan(mesh=(("data", 1),), activations={"batch": "data"}), jax.devices()[:1])


def from_pretrained(
    path: str | os.PathLike, plan: MeshPlan | None = None, **overrides: Any
) -> tuple[Llama, ModelConfig]:
    """A Hugging Face checkpoint of a family lcx implements (:mod:`lcx.models.hf_families`) as an
    lcx model, sharded by ``plan``.

    Args:
      path: directory with ``config.json`` and ``*.safetensors`` (one file, or shards with
        ``model.safetensors.index.json``). A multimodal Gemma 3 checkpoint loads its language
        model (the vision tower is not read).
      plan: bound plan; each parameter is placed by its parameter rules
        (:func:`lcx.models.model_shardings`), each device reading only its own slice. None: one
        device (:func:`single_device_plan`).
      **overrides: :class:`ModelConfig` fields on top of ``config.json`` (:func:`hf_config`),
        e.g. ``dtype="bfloat16"``, ``param_dtype="bfloat16"``, ``remat="full"``.

    Returns:
      ``(model, config)``: parameters in ``config.param_dtype`` (stored values cast; float32 by
      default, so BF16 checkpoints load exactly).

    Raises:
      HFImportError: unsupported config, missing / unexpected tensors, or wrong shapes (name,
        expected, got); checked before any tensor data is read.
      PlanError: the plan cannot shard this model (e.g. a dimension its mesh axes do not divide).
      FileNotFoundError: no config.json or safetensors files.
    """
    plan = single_device_plan() if plan is None else plan
    cfg = hf_config(path, **overrides)
    return load_weights(path, cfg, plan), cfg


def load_weights(path: str | os.PathLike, cfg: ModelConfig, plan: MeshPlan) -> Llama:
    """The weights of the Hugging Face checkpoint at ``path`` as an lcx model of ``cfg`` (the
    checkpoint's :func:`hf_config`, possibly with overrides that keep its shapes), sharded by
    ``plan``: what :func:`from_pretrained` and ``model=hf model.path=DIR`` runs load.

    Raises:
      HFImportError: missing / unexpected tensors, or a tensor whose shape is not the one
        ``cfg`` implies (name, expected, got); checked before any tensor data is read.
      PlanError: the plan cannot shard this model.
    """
    directory = pathlib.Path(path)
    _, _, mm = text_model(read_config(directory)[0])
    plan.plan.validate(plan.n_devices, dims=cfg.dims())
    files = _Files(directory)
    sources = _sources(cfg)
    if mm is not None:
        sources = _language_model(files, sources, mm)
    _check_names_and_shapes(files, cfg, sources, mm.other if mm is not None else ())

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
    return jax.tree_util.tree_unflatten(treedef, out)


def load_hf_llama(path: str | os.PathLike, plan: MeshPlan, **overrides: Any) -> tuple[Llama, ModelConfig]:
    """:func:`from_pretrained` with a plan (the name of lcx's first, Llama-only import)."""
    return from_pretrained(path, plan, **overrides)


__all__ = ["HFImportError", "from_pretrained", "hf_config", "load_hf_llama", "load_weights", "single_device_plan"]
