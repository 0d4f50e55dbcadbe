"""Hydra entry point: ``python -m lcx.eval checkpoint.dir=D [eval.lengths=[...]] [eval.depths=[...]]``.

Passkey / needle-in-a-haystack retrieval (:mod:`lcx.training.retrieval`) of a checkpoint across
context lengths and key depths, with the checkpoint's own model (RoPE scaling included) and
plan. Writes ``eval.json`` (settings, one result per (length, depth), exact match per length)
and ``passkey_heatmap.png`` in the Hydra run directory; prints the grid.
"""

from __future__ import annotations

import json
import pathlib
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

import lcx.conf  # noqa: F401  (registers the structured plan schema with Hydra)


def run_eval(cfg: DictConfig, out_dir: str | pathlib.Path, devices) -> dict:
    """Evaluate ``cfg.checkpoint.dir`` as configured; write ``eval.json`` and the heatmap.

    Raises:
      FileNotFoundError: no checkpoint there. ValueError / PlanError: a length the task or the
        plan cannot serve, or an unknown ``eval.task``.
    """
    from lcx.sharding import bind
    from lcx.sharding.config import plan_from_config
    from lcx.conf.schema import EvalCheckpointSchema, EvalSchema, check_section
    from lcx.training.checkpoint import Checkpoints
    from lcx.training.resume import load_model, resolve_dir
    from lcx.training.retrieval import grid, passkey_grid, write_heatmap

    check_section(cfg.eval, EvalSchema, "eval", tool="lcx.eval")
    check_section(cfg.checkpoint, EvalCheckpointSchema, "checkpoint", tool="lcx.eval")
    if cfg.eval.task != "passkey":
        raise ValueError(f"eval.task={cfg.eval.task!r} is unknown; lcx.eval has 'passkey'")
    ckpt = resolve_dir(cfg.checkpoint.dir)
    c = Checkpoints(ckpt, read_only=True)
    try:
        steps = c.steps()
        if not steps:
            raise FileNotFoundError(f"no checkpoint in {ckpt}")
        step = int(cfg.checkpoint.step) if cfg.checkpoint.step is not None else steps[-1]
        run = c.read_meta(step)["config"]
    finally:
        c.close()
    plan = plan_from_config(OmegaConf.create(run["plan"]), hardware=cfg.hardware)
    mp = bind(plan, devices)
    model, meta = load_model(ckpt, mp, step=step)
    S = int(run["train"]["seq_len"])
    e = cfg.eval
    lengths = [int(x) for x in e.lengths] if e.lengths is not None else [S // 2, S, 2 * S]
    digits = int(e.digits if e.digits is not None else (run.get("data") or {}).get("digits", 5))
    batch = int(e.global_batch if e.global_batch is not None else run["train"]["global_batch"])
    results = passkey_grid(model, mp, lengths=lengths, depths=list(e.depths), per_depth=int(e.per_depth),
                           global_batch=batch, digits=digits, seed=int(e.seed),
                           vocab_tiling=int((run.get("memory") or {}).get("vocab_tiling", 1)))
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lens, _, v = grid(results)
    report = {
        "task": "passkey",
        "checkpoint": str(ckpt),
        "step": int(meta["step"]),
        "model": run["model"],
        "plan": plan.name,
        "train_seq_len": S,
        "lengths": lengths,
        "depths": [float(d) for d in e.depths],
        "per_depth": int(e.per_depth),
        "digits": digits,
        "seed": int(e.seed),
        "exact_match_by_length": {str(s): float(v[:, j].mean()) for j, s in enumerate(lens)},
        "results": results,
    }
    (out_dir / "eval.json").write_text(json.dumps(report, indent=2))
    report["heatmap_writer"] = write_heatmap(
        results, out_dir / "passkey_heatmap.png", title=f"passkey, {run['model']['name']} step {meta['step']}"
    )
    return report


@hydra.main(version_base="1.3", config_path="conf", config_name="eval_config")
def _hydra_main(cfg: DictConfig) -> float:
    from lcx.train import explain_errors

    return explain_errors(_main, cfg)


def main() -> float:
    from lcx.train import check_command_line

    check_command_line("lcx.eval")
    return _hydra_main()


def _main(cfg: DictConfig) -> float:
    from hydra.core.hydra_config import HydraConfig

    from lcx.cost import apply_hardware_flags
    from lcx.train import configure_devices

    if not cfg.get("checkpoint") or not cfg.checkpoint.get("dir"):
        raise ValueError("lcx.eval needs a checkpoint to evaluate: python -m lcx.eval checkpoint.dir=DIR "
                         "(the checkpoint.dir of a python -m lcx.train run)")
    from lcx.conf.schema import EvalCheckpointSchema, EvalSchema, HardwareSchema, check_section

    check_section(cfg.eval, EvalSchema, "eval", tool="lcx.eval")
    check_section(cfg.checkpoint, EvalCheckpointSchema, "checkpoint", tool="lcx.eval")
    check_section(cfg.hardware, HardwareSchema, "hardware", tool="lcx.eval")
    apply_hardware_flags(cfg.hardware)
    devices = configure_devices(cfg)
    out = HydraConfig.get().runtime.output_dir
    rep = run_eval(cfg, out, devices)
    for r in rep["results"]:
        print(f"length {r['seq_len']:>7}  depth {r['depth']:.2f}  exact match {r['exact_match']:.2f}  "
              f"digits {r['digit_accuracy']:.2f}  nll {r['answer_nll']:.3f}", file=sys.stderr)
    print(f"wrote {out}/eval.json and passkey_heatmap.png", file=sys.stderr)
    return float(sum(r["exact_match"] for r in rep["results"]) / len(rep["results"]))


if __name__ == "__main__":
    main()
