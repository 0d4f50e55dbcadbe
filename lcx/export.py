"""Hydra entry point: ``python -m lcx.export checkpoint.dir=D out=DIR [export.dtype=bfloat16]``.

Writes a training checkpoint as a Hugging Face checkpoint (:func:`lcx.models.save_pretrained`):
``config.json``, safetensors shards with ``model.safetensors.index.json`` when there are several,
and the run's tokenizer files when its ``data.tokenizer`` was a ``tokenizer.json`` or a directory
holding one (a registered name such as ``byte`` has no files to copy); ``config.json`` carries
that tokenizer's BOS and EOS ids. The run's model and plan
come from the checkpoint's own ``meta`` (as :mod:`lcx.eval`); parameters are restored onto that
plan on this process's devices and gathered to the host one at a time.
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import hydra
from omegaconf import DictConfig

from lcx import cli
from lcx.reports.config import ExportQuery

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")
"""Files copied from a run's ``data.tokenizer`` directory (those that exist)."""


def tokenizer_files(data: dict[str, Any] | None) -> list[pathlib.Path]:
    """The tokenizer files of a run's ``data`` section: the ``tokenizer.json`` it names, or the
    :data:`TOKENIZER_FILES` in the directory it names; [] for a registered tokenizer or none.

    Raises:
      FileNotFoundError: ``data.tokenizer`` is a path that no longer exists (the export would
        silently lack the tokenizer the model was trained with).
    """
    from lcx.data.tokenizers import TOKENIZERS

    name = (data or {}).get("tokenizer")
    if not name or name in TOKENIZERS:
        return []
    p = pathlib.Path(str(name)).expanduser()
    if p.is_dir():
        return [p / f for f in TOKENIZER_FILES if (p / f).is_file()]
    if p.is_file():
        return [p]
    raise FileNotFoundError(f"the run's data.tokenizer={name!r} does not exist here; export needs its files")


def run_export(query: ExportQuery, devices: list) -> pathlib.Path:
    """Export the checkpoint ``query.checkpoint`` names to ``query.out``.

    Returns:
      The output directory.

    Raises:
      FileNotFoundError: no checkpoint there (or no such step), or a missing tokenizer path.
      HFExportError: a layer pattern Hugging Face Llama/Mistral cannot express (named).
    """
    from lcx.data.tokenizers import get_tokenizer
    from lcx.models.hf_export import save_pretrained
    from lcx.sharding import bind
    from lcx.sharding.config import plan_from_dict
    from lcx.training.resume import checkpoint_run, load_model

    ckpt, hw = query.checkpoint.dir, query.hardware
    step, run = checkpoint_run(ckpt, query.checkpoint.step)
    tok = tokenizer_files(run.get("data"))
    name = (run.get("data") or {}).get("tokenizer")
    tokenizer = get_tokenizer(str(name)) if name else None
    plan = plan_from_dict(run["plan"], default_block=hw.attention_block, default_kernel=hw.attention_kernel)
    model, _ = load_model(ckpt, bind(plan, devices), step=step)
    return save_pretrained(
        model,
        query.out,
        tokenizer_files=tok,
        max_shard_bytes=query.export.max_shard_bytes,
        dtype=query.export.dtype,
        bos_token_id=None if tokenizer is None else tokenizer.bos_id,
        eos_token_id=None if tokenizer is None else tokenizer.eos_id,
    )


def export(cfg: DictConfig) -> str:
    """Export ``checkpoint.dir`` to ``out``; the output directory.

    Raises:
      ValueError: no ``checkpoint.dir`` or ``out``, or a key unknown or mistyped; and
        :func:`run_export`'s errors.
    """
    from lcx.config import export_query

    query = export_query(cfg)  # every key known and typed, once
    devices = cli.start_devices(query.hardware)
    out = run_export(query, devices)
    print(f"wrote {out}: {', '.join(sorted(p.name for p in out.iterdir()))}", file=sys.stderr)
    return str(out)


@hydra.main(version_base="1.3", config_path=cli.CONFIG_PATH, config_name="export_config")
def main(cfg: DictConfig) -> str:
    return cli.explain_errors(export, cfg)


if __name__ == "__main__":
    cli.launch("lcx.export", main)
