"""Experiment (a): strategy sweep -- allgather, a2a, ring, usp x sequence lengths, 8 CPU devices.

Runs ``python -m lcx.train -m experiment=strategy_sweep`` (conf/experiment/strategy_sweep.yaml:
the tiny Llama on the stdlib corpus, a few steps per job) and gathers every job's
``metrics.jsonl`` into ``experiments/results/strategy_sweep.csv`` and ``.png``:

- tokens/s: median over the steps after the first (8 simulated devices share the machine's
  cores, so this is total work per token, not parallel speed-up);
- per-device memory: the compiled train step's ``memory_analysis().temp_size_in_bytes``;
- loss: the first and last steps' training losses, and every step's (the same data and
  initialisation in every job: the strategies compute the same function, so the losses agree
  up to float32 rounding -- which Adam's first steps can amplify; a check of correctness, not
  of learning).

    python experiments/strategy_sweep.py                       # ~5 min idle, ~15 min on 2 busy cores
    python experiments/strategy_sweep.py train.steps=2          # extra overrides go to every job
    python experiments/strategy_sweep.py --runs multirun/strategy_sweep/<stamp>  # gather only
"""

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _common as C  # noqa: E402

NAME = "strategy_sweep"
PLANS = ("allgather", "a2a", "ring", "usp")


def gather(sweep_dir: pathlib.Path) -> list[dict]:
    """One CSV row per run directory under ``sweep_dir``, sorted by plan then sequence length."""
    rows = []
    for run in C.load_runs(sweep_dir):
        cfg, s = run["config"], C.summarize(run["metrics"])
        if not s:
            continue
        plan = cfg.get("plan", {})
        mesh = run["info"].get("mesh") or plan.get("mesh", {})
        rows.append(
            {
                "plan": plan.get("name"),
                "strategy": plan.get("attention", {}).get("strategy"),
                "seq_len": int(cfg["train"]["seq_len"]),
                "global_batch": int(cfg["train"]["global_batch"]),
                "mesh": "x".join(f"{k}{v}" for k, v in mesh.items()),
                "steps": s["steps"],
                "tokens_per_sec": s["tokens_per_sec"],
                "step_time_s": s["step_time_s"],
                "temp_mib_per_device": s["temp_mib_per_device"],
                "compile_s": s["compile_s"],
                "first_loss": s["first_loss"],
                "final_loss": s["final_loss"],
                "losses": ";".join(f"{r['loss']:.6f}" for r in run["metrics"]),
                **C.provenance(run["info"]),
            }
        )
    order = {p: i for i, p in enumerate(PLANS)}
    rows.sort(key=lambda r: (order.get(r["plan"], 99), r["plan"] or "", r["seq_len"]))
    return rows


def plot(rows: list[dict], path: pathlib.Path, note: str = "") -> pathlib.Path:
    plt = C.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    plans = [p for p in dict.fromkeys(r["plan"] for r in rows)]
    for p in plans:
        rs = sorted((r for r in rows if r["plan"] == p), key=lambda r: r["seq_len"])
        x = [r["seq_len"] for r in rs]
        axes[0].plot(x, [float(r["tokens_per_sec"]) for r in rs], "o-", label=p)
        axes[1].plot(x, [float(r["temp_mib_per_device"]) for r in rs], "o-", label=p)
        axes[2].plot(x, [float(r["final_loss"]) for r in rs], "o-", label=p)
    for ax, title, unit in zip(
        axes,
        ("throughput", "compiled temp memory per device", "loss after the last step"),
        ("tokens / s (all 8 devices)", "MiB", "nats / token"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"lcx strategy sweep, tiny Llama, 8 simulated CPU devices{note}")
    return C.save_figure(fig, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=pathlib.Path, help="gather this sweep directory instead of running a new sweep")
    ap.add_argument("--latest", action="store_true", help="gather the newest multirun/strategy_sweep/* directory")
    ap.add_argument("--out", type=pathlib.Path, default=C.RESULTS / NAME, help="output path without suffix")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for the sweep")
    a = ap.parse_args(argv)
    sweep = a.runs or (C.latest_sweep_dir(NAME) if a.latest else None)
    if sweep is None:
        sweep = C.new_sweep_dir(NAME)
        C.run_multirun(NAME, sweep, a.overrides)
    rows = gather(sweep)
    if not rows:
        print(f"no metrics.jsonl under {sweep}", file=sys.stderr)
        return 1
    C.write_csv(rows, C.out_file(a.out, ".csv"))
    plot(rows, C.out_file(a.out, ".png"), f" ({C.machine_note()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
