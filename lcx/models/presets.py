"""The model presets: ``conf/model/*.yaml`` read as :class:`~lcx.models.config.ModelConfig` values.

The presets are read from ``conf/model/*.yaml``, so a model is named the same way, with the same
values, in code (``preset("llama3_70b")``) and in Hydra (``model=llama3_70b``).
"""

from __future__ import annotations

from lcx.models.config import ModelConfig


def _load_presets() -> dict[str, ModelConfig]:
    """Every ``conf/model/<name>.yaml`` (installed as the data package ``lcx.conf``) as a config, by
    ``<name>``: the values of a preset live once, in the file Hydra composes for ``model=<name>``.
    ``vocab_size: null`` (the tokenizer's, resolved at the config edge,
    :func:`lcx.config.run.model_config`) is the field's default here, 256: the byte tokenizer's,
    the default data's; code that names a preset has no tokenizer to take it from.

    Raises:
      ValueError: a file is not a mapping of :class:`ModelConfig` fields.
    """
    from importlib.resources import files

    from lcx.sharding.config import read_yaml

    out = {}
    for path in sorted((files("lcx.conf") / "model").iterdir(), key=lambda p: p.name):
        if not path.name.endswith(".yaml"):
            continue
        d = read_yaml(path.read_text())
        if not isinstance(d, dict):
            raise ValueError(f"conf/model/{path.name}: must be a mapping of ModelConfig fields, got {d!r}")
        if "path" in d:  # model=hf: a checkpoint's config.json, read at the config edge, is no preset
            continue
        d = {str(k): v for k, v in d.items() if not (k == "vocab_size" and v is None)}
        out[path.name.removesuffix(".yaml")] = ModelConfig.from_dict(d)
    return out


PRESETS: dict[str, ModelConfig] = _load_presets()
"""The model presets, by name: ``tiny`` (trains on two CPU cores; here byte-level, vocab 256), ``tiny_hybrid``
(tiny's sizes, 6 layers of layer kinds: per period two sliding-window layers of 512 tokens and one
global layer, :mod:`lcx.models.kinds`), ``llama3_1_8b``,
``llama3_70b`` (Llama 3 paper, arXiv:2407.21783, Table 3) and ``llama3_1_8b_longctx`` (MaxText's
long-context 8B: 16 heads of 256); the values and their reasons are in ``conf/model/*.yaml``."""


def preset(name: str) -> ModelConfig:
    """The named preset (see :data:`PRESETS`).

    Raises:
      ValueError: unknown name; the message lists the presets.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]
