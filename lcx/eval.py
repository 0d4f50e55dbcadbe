"""Hydra entry point: ``python -m lcx.eval checkpoint.dir=D [eval=passkey|ruler|niah|perplexity]
[eval.lengths=[...]] [eval.depths=[...]]``.

``eval=passkey`` (the default): passkey / needle-in-a-haystack retrieval, teacher-forced
(:mod:`lcx.training.retrieval`), of a checkpoint across context lengths and key depths, with the
checkpoint's own model (RoPE scaling included) and plan. Writes ``eval.json`` (settings, one
result per (length, depth), exact match per length) and ``passkey_heatmap.png`` in the Hydra run
directory (:func:`lcx.reports.passkey.run_eval`); prints the grid.

``eval=ruler`` (``niah``, ``perplexity``): RULER's tasks scored by generation (:mod:`lcx.evals`)
with the checkpoint's tokenizer; writes ``<name>.csv``, ``<name>_heatmap.png``, ``<name>.json``
with the effective length, and the loss-by-position curve
(:func:`lcx.reports.ruler.run_generation_eval`); prints the mean score per length (RULER's
percentage), the tasks a length could not hold (not run there) and the effective length.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from lcx import cli
from lcx.reports.passkey import run_eval  # noqa: F401  (the report, also called directly by tests)
from lcx.reports.ruler import run_generation_eval  # noqa: F401  (likewise)


def evaluate(cfg: DictConfig) -> float:
    """Evaluate ``checkpoint.dir``; the mean exact match over the (length, depth) grid
    (``eval=passkey``, a fraction), or the mean score over the lengths (generation presets, a
    percentage; NaN: only a curve).

    Raises:
      ValueError: no ``checkpoint.dir``, or a key unknown or mistyped; and :func:`run_eval`'s /
        :func:`run_generation_eval`'s errors.
    """
    from lcx.config import eval_query

    query = eval_query(cfg)  # every key known and typed, once
    devices = cli.start_devices(query.hardware)
    out = cli.output_dir()
    if query.eval.task != "passkey":
        return generation_summary(run_generation_eval(query, out, devices), out)
    rep = run_eval(query, out, devices)
    for r in rep["results"]:
        print(
            f"length {r['seq_len']:>7}  depth {r['depth']:.2f}  exact match {r['exact_match']:.2f}  "
            f"digits {r['digit_accuracy']:.2f}  nll {r['answer_nll']:.3f}",
            file=sys.stderr,
        )
    print(f"wrote {out}/eval.json and passkey_heatmap.png", file=sys.stderr)
    return float(sum(r["exact_match"] for r in rep["results"]) / len(rep["results"]))


def generation_summary(rep: dict, out) -> float:
    """Print the mean score per length (with the tasks it covers when some did not run), the
    tasks not run and why, and the effective length of a generation report; return the mean over
    the lengths (percent; NaN without tasks, or where no task ran)."""
    tasks = rep["tasks"]
    for s, v in rep["mean_by_length"].items():
        ran = rep["tasks_by_length"].get(s, tasks)
        cover = "" if len(ran) == len(tasks) else f"  ({len(ran)} of {len(tasks)} tasks: {', '.join(ran)})"
        print(f"length {int(s):>7}  mean score {v:.2f}{cover}", file=sys.stderr)
    for r in rep["skipped"]:
        print(f"not run: {r['task']} at {r['seq_len']}: {r['reason']}", file=sys.stderr)
    if tasks:
        over = ", ".join(map(str, rep["complete_lengths"])) or "none: no length ran every task"
        print(
            f"effective length {rep['effective_length']} (threshold {rep['threshold']:g}, over lengths {over})",
            file=sys.stderr,
        )
    print(f"wrote {out}/{rep['eval']}.json", file=sys.stderr)
    means = list(rep["mean_by_length"].values())
    return float(sum(means) / len(means)) if means else float("nan")


@hydra.main(version_base="1.3", config_path=cli.CONFIG_PATH, config_name="eval_config")
def main(cfg: DictConfig) -> float:
    return cli.explain_errors(evaluate, cfg)


if __name__ == "__main__":
    cli.launch("lcx.eval", main)
