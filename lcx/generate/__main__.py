"""Hydra entry point: ``python -m lcx.generate checkpoint.dir=D generate.prompts=[...] [plan=ring]``.

Context-parallel generation (:func:`lcx.generate.generate`) from a training checkpoint: the
model and tokenizer are the run's, the plan the run's unless ``plan=`` names another
(``conf/plan/*.yaml``; the parameters are restored onto it). Writes ``generate.json`` (settings,
prompts, token ids and text of each continuation) in the Hydra run directory; prints each
continuation. ``conf/generate_config.yaml`` documents every key.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import hydra
from omegaconf import DictConfig

from lcx import cli
from lcx.reports.config import GenerateQuery


def run_generate(query: GenerateQuery, devices: list, out: str | pathlib.Path | None = None) -> dict[str, Any]:
    """Generate the continuations of ``query.generate.prompts``; the report (also written to
    ``out/generate.json`` when ``out`` is given).

    Raises:
      FileNotFoundError: no checkpoint there (or no such step).
      ValueError: what :func:`lcx.generate.generate` refuses (an empty prompt, a prompt beyond
        the RoPE range, a plan that cannot run the model).
    """
    import jax
    import numpy as np

    from lcx.data.tokenizers import get_tokenizer
    from lcx.generate import generate
    from lcx.sharding import bind
    from lcx.sharding.config import plan_from_dict
    from lcx.training.resume import checkpoint_run, load_model

    ckpt, hw, opts = query.checkpoint.dir, query.hardware, query.generate
    step, run = checkpoint_run(ckpt, query.checkpoint.step)
    plan = query.plan or plan_from_dict(
        run["plan"], default_block=hw.attention_block, default_kernel=hw.attention_kernel
    )
    mp = bind(plan, devices)
    model, _ = load_model(ckpt, mp, step=step)
    tokenizer = get_tokenizer(str((run.get("data") or {}).get("tokenizer") or "byte"))
    prompts = [np.asarray(tokenizer.encode(p), np.int32) for p in opts.prompts]
    eos = tokenizer.eos_id if opts.stop_at_eos else None
    tokens = np.asarray(
        generate(
            model,
            prompts,
            plan=mp,
            max_new_tokens=opts.max_new_tokens,
            temperature=opts.temperature,
            top_p=opts.top_p,
            key=jax.random.key(opts.seed) if opts.temperature > 0 else None,
            eos_id=eos,
        )
    )
    rows = []
    for text, ids in zip(opts.prompts, tokens.tolist(), strict=True):
        kept = ids[: ids.index(eos) + 1] if eos is not None and eos in ids else ids
        rows.append({"prompt": text, "tokens": ids, "text": tokenizer.decode([t for t in kept if t != eos])})
    report = {
        "checkpoint": str(ckpt),
        "step": step,
        "plan": plan.name,
        "settings": {k: getattr(opts, k) for k in ("max_new_tokens", "temperature", "top_p", "seed", "stop_at_eos")},
        "results": rows,
    }
    if out is not None:
        (pathlib.Path(out) / "generate.json").write_text(json.dumps(report, indent=1))
    return report


def generate_cli(cfg: DictConfig) -> dict[str, Any]:
    """Run ``python -m lcx.generate``; the report.

    Raises:
      ValueError: no ``checkpoint.dir`` or prompts, a key unknown or mistyped; and
        :func:`run_generate`'s errors.
    """
    from lcx.config import generate_query

    query = generate_query(cfg)  # every key known and typed, once
    devices = cli.start_devices(query.hardware)
    out = cli.output_dir()
    report = run_generate(query, devices, out)
    for r in report["results"]:
        print(f"{r['prompt']!r} -> {r['text']!r}", file=sys.stderr)
    print(f"wrote {out}/generate.json", file=sys.stderr)
    return report


@hydra.main(version_base="1.3", config_path=cli.CONFIG_PATH, config_name="generate_config")
def main(cfg: DictConfig) -> dict[str, Any]:
    return cli.explain_errors(generate_cli, cfg)


if __name__ == "__main__":
    cli.launch("lcx.generate", main)
