"""Hydra entry point: ``python -m lcx.eval checkpoint.dir=D [eval.lengths=[...]] [eval.depths=[...]]``.

Passkey / needle-in-a-haystack retrieval (:mod:`lcx.training.retrieval`) of a checkpoint across
context lengths and key depths, with the checkpoint's own model (RoPE scaling included) and
plan. Writes ``eval.json`` (settings, one result per (length, depth), exact match per length)
and ``passkey_heatmap.png`` in the Hydra run directory (:func:`lcx.reports.passkey.run_eval`);
prints the grid.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from lcx import cli
from lcx.reports.passkey import run_eval  # noqa: F401  (the report, also called directly by tests)


def evaluate(cfg: DictConfig) -> float:
    """Evaluate ``checkpoint.dir``; the mean exact match over the (length, depth) grid.

    Raises:
      ValueError: no ``checkpoint.dir``, or a key unknown or mistyped; and :func:`run_eval`'s errors.
    """
    from lcx.config import eval_query

    query = eval_query(cfg)  # every key known and typed, once
    devices = cli.start_devices(query.hardware)
    out = cli.output_dir()
    rep = run_eval(query, out, devices)
    for r in rep["results"]:
        print(
            f"length {r['seq_len']:>7}  depth {r['depth']:.2f}  exact match {r['exact_match']:.2f}  "
            f"digits {r['digit_accuracy']:.2f}  nll {r['answer_nll']:.3f}",
            file=sys.stderr,
        )
    print(f"wrote {out}/eval.json and passkey_heatmap.png", file=sys.stderr)
    return float(sum(r["exact_match"] for r in rep["results"]) / len(rep["results"]))


@hydra.main(version_base="1.3", config_path=cli.CONFIG_PATH, config_name="eval_config")
def main(cfg: DictConfig) -> float:
    return cli.explain_errors(evaluate, cfg)


if __name__ == "__main__":
    cli.launch("lcx.eval", main)
