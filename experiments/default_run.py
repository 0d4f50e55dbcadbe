"""The README's main job, ``python -m lcx.train`` with no override, over seeds, on this stack.

Runs ``python -m lcx.train -m train.seed=0,1,2`` (one Hydra multirun: the default config, only
the seed changed; the seed draws the initial weights and the order of the training rows), then
writes one row per seed into ``experiments/results/default_run.csv``, keeping the rows of the
other stack (a stack is the Python minor version: 3.12 is CI's *current* stack, 3.11 its
*floor*), and plots every run's loss curve into ``default_run.png``.

Per run: the final validation loss (step 60), the last training loss, the largest rise of the
training loss's 3-step running mean above its best value so far after warmup
(:func:`max_rise`; issue 37's stability criterion: at most 15%), the largest gradient norm, the
per-step losses, and the commit and versions that made it.

    python experiments/default_run.py                     # 3 seeds on this stack (~6 min, 2 cores)
    python3.11 experiments/default_run.py                 # ... and on the floor stack's venv
    python experiments/default_run.py --runs multirun/default_run/<stamp>   # gather only
    python experiments/default_run.py --summary           # the README's band from the CSV

``tests/test_default_run.py`` (marked slow) runs the main job and checks that it lands in the
band this CSV gives for its stack (:func:`band`).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
from collections.abc import Mapping, Sequence

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _common as C  # noqa: E402

NAME = "default_run"
SEEDS = (0, 1, 2)
STACKS = {"3.12": "current", "3.11": "floor"}
RISE_LIMIT = 0.15
"""Issue 37: after warmup the 3-step running mean never rises more than 15% above its best."""


def stack_of(python: str) -> str:
    """``current`` / ``floor`` for a Python version string (other versions: ``python X.Y``)."""
    minor = ".".join(python.split(".")[:2])
    return STACKS.get(minor, f"python {minor}")


def max_rise(losses: Sequence[float], warmup_steps: int, window: int = 3) -> float:
    """Largest ``m_i / min(m_0 .. m_i) - 1`` over the running means ``m_i`` of ``window`` steps
    whose last step comes after warmup (steps ``> warmup_steps``); 0 for a curve that never rises.

    Args:
      losses: training loss of steps 1, 2, ... (nats per token).
      warmup_steps: the run's warmup (``train.warmup_steps``, or 10% of the steps when null).
      window: steps per running mean.
    """
    means = [sum(losses[i : i + window]) / window for i in range(len(losses) - window + 1)]
    worst, best = 0.0, float("inf")
    for i, m in enumerate(means):
        best = min(best, m)
        if i + window > warmup_steps:  # the mean ends at step i + window
            worst = max(worst, m / best - 1)
    return worst


def row_of(run: Mapping) -> dict:
    """One CSV row of a finished run (``C.load_runs`` record)."""
    t = run["config"]["train"]
    metrics = run["metrics"]
    losses = [float(m["loss"]) for m in metrics]
    warmup = t["warmup_steps"] if t.get("warmup_steps") is not None else max(1, int(t["steps"]) // 10)
    vals = [m["val_loss"] for m in metrics if m.get("val_loss") is not None]
    prov = C.provenance(run["info"])
    return {
        "stack": stack_of(prov["python"]),
        "seed": int(t["seed"]),
        "steps": len(metrics),
        "final_val_loss": float(vals[-1]),
        "final_loss": losses[-1],
        "max_rise": max_rise(losses, int(warmup)),
        "max_grad_norm": max(float(m["grad_norm"]) for m in metrics),
        "losses": ";".join(f"{x:.6f}" for x in losses),
        **prov,
    }


def band(rows: Sequence[Mapping], stack: str) -> tuple[float, float, int]:
    """``(mean, sample standard deviation, runs)`` of the final validation loss on ``stack``.

    Raises:
      ValueError: fewer than two runs of that stack (run this script on it first).
    """
    vals = [float(r["final_val_loss"]) for r in rows if r["stack"] == stack]
    if len(vals) < 2:
        raise ValueError(f"{len(vals)} runs of the {stack} stack in {NAME}.csv; run experiments/{NAME}.py on it")
    return statistics.fmean(vals), statistics.stdev(vals), len(vals)


def summary(rows: Sequence[Mapping]) -> list[str]:
    """One line per stack (mean +- sd of the final validation loss, largest rise), then how far
    apart the stacks' seed-0 runs end."""
    lines = []
    for stack in sorted({r["stack"] for r in rows}):
        mine = [r for r in rows if r["stack"] == stack]
        mean, sd, n = band(rows, stack)
        rise = max(float(r["max_rise"]) for r in mine)
        lines.append(
            f"{stack} (python {mine[0]['python']}, jax {mine[0]['jax']}): final validation loss "
            f"{mean:.4f} +- {sd:.4f} over {n} seeds; largest rise after warmup {100 * rise:.1f}%"
        )
    seed0 = {r["stack"]: float(r["final_val_loss"]) for r in rows if int(r["seed"]) == 0}
    if {"current", "floor"} <= seed0.keys():
        gap = abs(seed0["current"] / seed0["floor"] - 1)
        lines.append(f"seed 0: current {seed0['current']:.4f} vs floor {seed0['floor']:.4f} ({100 * gap:.2f}% apart)")
    return lines


def plot(rows: Sequence[Mapping], path: pathlib.Path) -> pathlib.Path:
    plt = C.pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    styles = {"current": "-", "floor": "--"}
    for r in sorted(rows, key=lambda r: (r["stack"], int(r["seed"]))):
        losses = [float(x) for x in str(r["losses"]).split(";")]
        mean3 = [sum(losses[i : i + 3]) / 3 for i in range(len(losses) - 2)]
        ax.plot(
            range(3, len(losses) + 1),
            mean3,
            styles.get(r["stack"], ":"),
            color=f"C{int(r['seed'])}",
            lw=1.2,
            label=f"{r['stack']} seed {r['seed']}: val {float(r['final_val_loss']):.3f}",
        )
    ax.set_xlabel("step")
    ax.set_ylabel("training loss, 3-step running mean (nats / byte)")
    ax.set_title("python -m lcx.train (tiny Llama, 4,096 tokens, data 2 x context 4, embedded stdlib)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return C.save_figure(fig, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=pathlib.Path, help="gather these finished runs instead of training")
    ap.add_argument("--summary", action="store_true", help="print the band of the committed CSV and exit")
    ap.add_argument("--out", type=pathlib.Path, default=C.RESULTS / NAME)
    a = ap.parse_args(argv)
    csv_path = C.out_file(a.out, ".csv")
    if a.summary:
        print("\n".join(summary(C.read_csv(csv_path))))
        return 0
    sweep = a.runs
    if sweep is None:
        sweep = C.new_sweep_dir(NAME)
        cmd = [sys.executable, "-m", "lcx.train", "-m", f"train.seed={','.join(map(str, SEEDS))}"]
        C.run_command([*cmd, f"hydra.sweep.dir={sweep}"])
    new = [row_of(run) for run in C.load_runs(sweep)]
    if not new:
        print(f"no runs under {sweep}", file=sys.stderr)
        return 1
    stacks = {r["stack"] for r in new}
    kept = [r for r in (C.read_csv(csv_path) if csv_path.exists() else []) if r["stack"] not in stacks]
    rows = sorted([*kept, *new], key=lambda r: (r["stack"], int(r["seed"])))
    C.write_csv(rows, csv_path)
    plot(rows, C.out_file(a.out, ".png"))
    print("\n".join(summary(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
