"""Export an lcx model as a Hugging Face checkpoint of its family: the inverse of :mod:`lcx.models.hf`.

:func:`save_pretrained` writes what transformers' ``save_pretrained`` writes for
the family's ``*ForCausalLM`` (:mod:`lcx.models.hf_families`): ``config.json`` (:func:`to_hf_config`)
and the weights as safetensors, one ``model.safetensors`` when they fit ``max_shard_bytes``, else
``model-0000i-of-0000n.safetensors`` shards plus ``model.safetensors.index.json``
(``{"metadata": {"total_size": bytes}, "weight_map": {tensor: file}}``). Shards are filled in
transformers' tensor order (embeddings, layers 0..L-1, final norm, head), a new shard starting
when the next tensor would overflow the current one (huggingface_hub's
``split_torch_state_dict_into_shards`` rule: a tensor larger than the limit gets a shard of its
own). Every file carries safetensors metadata ``{"format": "pt"}``, which transformers requires.

The layout mapping is :mod:`lcx.models.hf`'s table read right to left: each lcx per-layer array
is transposed back (inverse of the import permutation) and flattened to the HF ``[out, in]``
``nn.Linear`` weight; a tied model writes no ``lm_head.weight``. Values are copied unchanged (the
parameter dtype is the stored dtype unless ``dtype`` asks for another), so importing an export
gives the original parameters bit for bit.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import ml_dtypes  # noqa: F401 - bfloat16 NumPy arrays for safetensors
import numpy as np
from safetensors.numpy import save_file

from lcx.models.config import ModelConfig
from lcx.models.hf import _Source, _sources
from lcx.models.hf_config import HFExportError
from lcx.models.hf_families import OPTION_FIELDS, Family, family_for_options
from lcx.models.llama import Llama
from lcx.models.rotary import RopeConfig

DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3
"""transformers' default ``max_shard_size`` ("5GB", decimal in transformers 4.x docs; 5 GiB here)."""

_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


# ------------------------------------------------------------------------------------------ config.json
def _export_rope(r: RopeConfig) -> dict[str, Any] | None:
    """transformers 4.x ``rope_scaling`` (read by 5.x too) of ``r``, or None for plain RoPE."""
    if r.scaling_type is None:
        return None
    if r.scaling_type == "ntk":
        raise ValueError(
            f"rope_scaling_type='ntk' has no transformers rope_type (its 'dynamic' follows the sequence "
            f"length); export the same frequencies as plain RoPE: model.rope_scaling_type=null "
            f"model.rope_scaling_factor=null model.rope_theta={r.base!r}"
        )
    out: dict[str, Any] = {"rope_type": r.scaling_type, "factor": float(r.factor)}  # type: ignore[arg-type]
    if r.scaling_type == "llama3":
        out.update(
            original_max_position_embeddings=int(r.original_max_len),
            low_freq_factor=float(r.low_freq_factor),
            high_freq_factor=float(r.high_freq_factor),
        )
    elif r.scaling_type == "yarn":
        out.update(
            original_max_position_embeddings=int(r.original_max_len),
            beta_fast=float(r.beta_fast),
            beta_slow=float(r.beta_slow),
        )
        if r.attention_factor is not None:
            out["attention_factor"] = float(r.attention_factor)
    return out


def _family(cfg: ModelConfig) -> Family:
    """The family ``cfg`` is written as. Raises HFExportError naming what no family expresses."""
    kinds = cfg.period_kinds
    desc = [k.to_dict() for k in kinds]
    for k in kinds:
        if k.kind == "chunked" or not k.rope or k.sinks:
            raise HFExportError(
                f"layer kind {k.to_dict()} (pattern {desc}) cannot be written as a Hugging Face model: "
                "LlamaForCausalLM, MistralForCausalLM, Qwen2/Qwen3ForCausalLM and Gemma3ForCausalLM have "
                "global or sliding attention with RoPE and no sinks"
            )
    windows = {k.window for k in kinds if k.window is not None}
    if len(windows) > 1:
        raise HFExportError(f"layer pattern {desc} has windows {sorted(windows)}; Hugging Face configs have one")
    options = {f: getattr(cfg, f) for f in OPTION_FIELDS}
    fam = family_for_options(options, windowed=bool(windows), uniform=len(set(kinds)) == 1)
    if fam is None:
        why = "mixes kinds" if len(set(kinds)) > 1 else "has options"
        raise HFExportError(
            f"an lcx model with family options {options} and layer pattern {desc} {why} that no Hugging Face "
            "family lcx writes expresses (Llama/Mistral: one kind for all layers; Qwen2.5: biases; Qwen3: "
            "QK-norm; Gemma 3: its own set; lcx.models.hf_families)"
        )
    per_kind_rope = any(k.rope_config(cfg.rope) != cfg.rope for k in kinds)
    if per_kind_rope and fam.model_type != "gemma3_text":
        raise HFExportError(f"layer pattern {desc} has per-kind RoPE; {fam.architecture} has one RoPE for all layers")
    if cfg.query_pre_attn_scalar is not None and "query_pre_attn_scalar" not in fam.keys:
        raise HFExportError(f"query_pre_attn_scalar={cfg.query_pre_attn_scalar}: {fam.architecture} has no such key")
    return fam


def _layer_keys(cfg: ModelConfig, fam: Family) -> dict[str, Any]:
    """RoPE, window and layer-type keys of ``cfg`` written as ``fam``."""
    kinds = cfg.layer_kinds
    types = ["sliding_attention" if k.kind == "sliding" else "full_attention" for k in kinds]
    window = next((k.window for k in kinds if k.kind == "sliding"), None)
    out: dict[str, Any] = {"rope_theta": cfg.rope_theta, "rope_scaling": _export_rope(cfg.rope)}
    if fam.model_type == "mistral":
        out["sliding_window"] = window
    elif fam.model_type in ("qwen2", "qwen3"):
        out.update(use_sliding_window=window is not None, sliding_window=window, max_window_layers=0)
        out["layer_types"] = types
    elif fam.model_type == "gemma3_text":
        rope = {t: k.rope_config(cfg.rope) for t, k in zip(types, kinds)}
        local, glob = rope.get("sliding_attention", cfg.rope), rope.get("full_attention", cfg.rope)
        if local is None or glob is None or local.scaling_type is not None:  # pragma: no cover - _family refused
            raise HFExportError("Gemma 3's sliding layers have unscaled RoPE")
        out.update(rope_theta=glob.theta, rope_local_base_freq=local.theta, rope_scaling=_export_rope(glob))
        out.update(sliding_window=window or cfg.rope_original_max_len, layer_types=types)
        q = cfg.query_pre_attn_scalar or cfg.head_dim
        out["query_pre_attn_scalar"] = int(q) if float(q).is_integer() else q  # transformers types it int
        out.update(final_logit_softcapping=None, attn_logit_softcapping=None)
    return out


def to_hf_config(
    cfg: ModelConfig,
    *,
    torch_dtype: str,
    max_position_embeddings: int | None = None,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> dict[str, Any]:
    """The ``config.json`` of ``cfg`` as the Hugging Face family whose options it has
    (:func:`lcx.models.hf_families.family_for_options`): the inverse of
    :func:`lcx.models.hf_config.hf_config`.

    Args:
      cfg: the model's configuration.
      torch_dtype: the dtype the weights are stored in (``float32`` / ``bfloat16``).
      max_position_embeddings: written as given; None: ``rope_original_max_len x factor`` for
        scaled RoPE (what transformers derives YaRN's factor from), else ``rope_original_max_len``.
      bos_token_id: the tokenizer's BOS id; None is written as null (not omitted, which would
        give transformers' default, wrong for most vocabularies).
      eos_token_id: the tokenizer's EOS id; None is written as null.

    Raises:
      HFExportError: family options or a layer pattern no family expresses (chunked attention,
        NoPE layers, sinks, several windows, per-kind RoPE outside Gemma 3, mixed kinds with
        Llama's options), naming it.
    """
    fam = _family(cfg)
    if max_position_embeddings is None:
        scaled = [r for r in (k.rope_config(cfg.rope) for k in cfg.period_kinds) if r is not None and r.factor]
        factor = max((r.factor or 1.0 for r in scaled), default=1.0)
        max_position_embeddings = int(round(cfg.rope_original_max_len * factor))
    out: dict[str, Any] = {
        "architectures": [fam.architecture],
        "model_type": fam.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.mlp_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_dropout": 0.0,
        "torch_dtype": torch_dtype,
        "use_cache": True,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        **_layer_keys(cfg, fam),
    }
    if fam.model_type == "gemma3_text":
        out["hidden_activation"] = "gelu_pytorch_tanh"
    else:
        out["hidden_act"] = "silu"
    if "attention_bias" in fam.no_op:
        out["attention_bias"] = False
    if fam.model_type == "llama":
        out.update(mlp_bias=False, pretraining_tp=1)
    return out


def _hf_order(cfg: ModelConfig, sources: dict[str, _Source]) -> list[tuple[str, str, int | None]]:
    """``(lcx leaf path, HF name, layer)`` in transformers' state-dict order."""
    stacked = [(p, s) for p, s in sources.items() if s.stacked]
    out: list[tuple[str, str, int | None]] = [(".embed.weight", sources[".embed.weight"].name, None)]
    for l in range(cfg.n_layers):
        out += [(p, s.name.format(l=l), l) for p, s in stacked]
    out.append((".final_norm.weight", sources[".final_norm.weight"].name, None))
    if ".head" in sources:
        out.append((".head", sources[".head"].name, None))
    return out


def hf_tensors(model: Llama, dtype: str | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """``(HF name, array)`` for every weight of ``model``, in transformers' order, on the host.

    Args:
      model: an lcx Llama whose parameters this process can address in full (one process;
        any sharding: each leaf is gathered to the host one at a time).
      dtype: ``float32`` / ``bfloat16`` to cast to; None: each parameter's own dtype.

    Yields:
      HF name and its ``[out, in]`` (or ``[D]``) NumPy array, C-contiguous.

    Raises:
      HFExportError: a parameter spread over several processes, or a dtype lcx does not store.
    """
    cfg = model.config
    sources = _sources(cfg)
    leaves = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(model)[0]}
    unknown = sorted(set(leaves) - set(sources))
    if unknown:  # e.g. attention sinks; to_hf_config refuses such models first
        raise HFExportError(f"lcx parameters {unknown} have no place in a Hugging Face checkpoint")
    host: dict[str, np.ndarray] = {}
    for path, name, layer in _hf_order(cfg, sources):
        if path not in host:
            leaf = leaves[path]
            if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
                raise HFExportError(f"{path} spans several processes; export from a single process")
            host[path] = np.asarray(jax.device_get(leaf))
        src = sources[path]
        x = host[path][layer] if src.stacked else host[path]
        view = np.transpose(x, np.argsort(src.perm))  # lcx dim i = view dim perm[i]
        stored = (int(np.prod(src.rows_shape)),) + ((int(np.prod(src.cols_shape)),) if src.cols_shape else ())
        out = np.ascontiguousarray(view.reshape(stored))
        if dtype is not None:
            if dtype not in _DTYPES:
                raise HFExportError(f"dtype={dtype!r}: export writes one of {sorted(_DTYPES)}")
            out = out.astype(_DTYPES[dtype])
        yield name, out


def _shards(tensors: list[tuple[str, np.ndarray]], max_shard_bytes: int) -> list[dict[str, np.ndarray]]:
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, x in tensors:
        if shards[-1] and size + x.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = x
        size += x.nbytes
    return shards


def save_pretrained(
    model: Llama,
    path: str | os.PathLike,
    *,
    tokenizer_files: Sequence[str | os.PathLike] | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    dtype: str | None = None,
    max_position_embeddings: int | None = None,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> pathlib.Path:
    """Write ``model`` as a Hugging Face checkpoint that ``AutoModelForCausalLM.from_pretrained``
    and :func:`lcx.models.hf.load_hf_llama` load.

    Args:
      model: an lcx model; its family options and layer kinds choose the family
        (:func:`to_hf_config`: e.g. uniform global Llama options -> LlamaForCausalLM, uniform
        sliding -> MistralForCausalLM, QK-norm -> Qwen3ForCausalLM, Gemma's -> Gemma3ForCausalLM).
      path: output directory (created; existing checkpoint files in it are overwritten).
      tokenizer_files: files copied next to the weights (e.g. ``tokenizer.json``).
      max_shard_bytes: largest shard in bytes (a single larger tensor gets its own shard).
      dtype: stored dtype (``float32``/``bfloat16``); None: the parameters' (one dtype for all).
      max_position_embeddings: for ``config.json`` (:func:`to_hf_config`).
      bos_token_id: the tokenizer's BOS id for ``config.json`` (None: null).
      eos_token_id: the tokenizer's EOS id for ``config.json`` (None: null).

    Returns:
      The output directory.

    Raises:
      HFExportError: a model no Hugging Face family expresses (named), mixed parameter
        dtypes without ``dtype``, or a parameter spread over several processes.
      ValueError: ``max_shard_bytes`` not positive. FileNotFoundError: a missing tokenizer file.
    """
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes={max_shard_bytes} must be positive (bytes per safetensors file)")
    cfg: ModelConfig = model.config
    dtypes = {str(x.dtype) for x in jax.tree.leaves(model)}
    if dtype is None and len(dtypes) != 1:
        raise HFExportError(f"parameters have dtypes {sorted(dtypes)}; pass dtype='float32' or 'bfloat16'")
    torch_dtype = dtype or dtypes.pop()
    hf_cfg = to_hf_config(
        cfg,
        torch_dtype=torch_dtype,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
    )
    out = pathlib.Path(path)
    tok = [pathlib.Path(f) for f in tokenizer_files or ()]
    for f in tok:
        if not f.is_file():
            raise FileNotFoundError(f"tokenizer file {f} does not exist")
    out.mkdir(parents=True, exist_ok=True)
    tensors = list(hf_tensors(model, dtype))
    shards = _shards(tensors, max_shard_bytes)
    n = len(shards)
    for old in [*out.glob("model*.safetensors"), out / "model.safetensors.index.json"]:
        old.unlink(missing_ok=True)
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, 1):
        fname = "model.safetensors" if n == 1 else f"model-{i:05d}-of-{n:05d}.safetensors"
        save_file(shard, out / fname, metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
    if n > 1:
        index = {"metadata": {"total_size": sum(x.nbytes for _, x in tensors)}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    (out / "config.json").write_text(json.dumps(hf_cfg, indent=2, sort_keys=True) + "\n")
    for f in tok:
        shutil.copy(f, out / f.name)
    return out


__all__ = ["DEFAULT_MAX_SHARD_BYTES", "HFExportError", "hf_tensors", "save_pretrained", "to_hf_config"]
