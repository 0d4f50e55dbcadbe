"""The 14M-token recipe's structure, trained here: ``experiment=longctx_replica_cpu``.

Runs, each as a user would (``python -m lcx.train`` in a subprocess, 8 simulated CPU devices):

1. ``train``: the replica as configured (ring + zigzag over 8 devices, ZeRO-3 parameters, remat
   custom with the context and block input offloaded, vocabulary tiling 16, optimizer and
   parameter host offload, one sequence of 32,768 tokens, V = 128,256): 30 steps; the loss must
   fall.
2. ``tiled_offloaded`` vs ``plain``: the same structure for 5 steps with tiling and both
   offloads on, and with all three off. The plain step at 32,768 tokens needs its whole float32
   logits (4,096 x 128,256 per device; with their log-softmax and cotangent 6,045 MiB per
   device by the ledger, 47 GiB for the 8 devices, more than this machine's RAM), so this pair
   runs at ``--equal-seq-len`` (8,192) tokens; the losses must agree within 1e-5 (relative).

Writes ``experiments/results/longctx_replica.csv`` (one row per run and step) and ``.png``.

    python experiments/longctx_replica.py                 # all three runs (~30 min on 2 cores)
    python experiments/longctx_replica.py --runs DIR      # gather existing runs only
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _common as C  # noqa: E402

NAME = "longctx_replica"
OFF = ["memory.vocab_tiling=1", "memory.offload_optimizer=false", "memory.offload_params=false"]


def runs(equal_seq_len: int) -> dict[str, list[str]]:
    eq = [f"train.seq_len={equal_seq_len}", "train.steps=5", "train.eval_every=5"]
    return {"train": [], "tiled_offloaded": eq, "plain": eq + OFF}


def launch(sweep: pathlib.Path, equal_seq_len: int, parts: list[str]) -> None:
    for name, ov in runs(equal_seq_len).items():
        if name not in parts or (sweep / name / "metrics.jsonl").exists():
            continue
        cmd = [
            sys.executable,
            "-m",
            "lcx.train",
            "experiment=longctx_replica_cpu",
            f"hydra.run.dir={sweep / name}",
            *ov,
        ]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=C.ROOT, check=True)


def gather(sweep: pathlib.Path) -> list[dict]:
    rows = []
    for name in ("train", "tiled_offloaded", "plain"):
        m = C.read_jsonl(sweep / name / "metrics.jsonl")
        cfg = C.load_runs(sweep / name)[0]["config"]
        for r in m:
            rows.append(
                {
                    "run": name,
                    "seq_len": cfg["train"]["seq_len"],
                    "vocab_tiling": cfg["memory"]["vocab_tiling"],
                    "offload": bool(cfg["memory"]["offload_optimizer"] and cfg["memory"]["offload_params"]),
                    "step": r["step"],
                    "loss": r["loss"],
                    "val_loss": r.get("val_loss", float("nan")),
                    "step_time_s": r["step_time_s"],
                    "temp_mib_per_device": (r.get("temp_bytes_per_device") or float("nan")) / C.MIB,
                }
            )
    return rows


def check(rows: list[dict]) -> list[str]:
    """The experiment's verdicts, one line each."""
    train = [r["loss"] for r in rows if r["run"] == "train"]
    a = [r["loss"] for r in rows if r["run"] == "tiled_offloaded"]
    b = [r["loss"] for r in rows if r["run"] == "plain"]
    k = min(5, len(train))
    falls = sum(train[-k:]) / k < sum(train[:k]) / k
    worst = max(abs(x - y) / abs(y) for x, y in zip(a, b)) if a and len(a) == len(b) else float("nan")
    return [
        f"train: {len(train)} steps, loss {train[0]:.4f} -> {train[-1]:.4f} (mean of the last {k} "
        f"{sum(train[-k:]) / k:.4f} vs the first {k} {sum(train[:k]) / k:.4f}): {'falls' if falls else 'DOES NOT FALL'}",
        f"tiled + offloaded vs plain, {len(a)} steps: largest relative loss difference {worst:.2e} "
        f"({'within' if worst <= 1e-5 else 'OUTSIDE'} 1e-5)",
    ]


def plot(rows: list[dict], path: pathlib.Path, note: str) -> None:
    plt = C.pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    tr = [r for r in rows if r["run"] == "train"]
    ax1.plot([r["step"] for r in tr], [r["loss"] for r in tr], marker=".", label="train loss")
    val = [r for r in tr if r["val_loss"] == r["val_loss"]]
    ax1.plot([r["step"] for r in val], [r["val_loss"] for r in val], "s", label="validation loss")
    ax1.set(
        xlabel="step",
        ylabel="nats/token",
        title=f"replica: {tr[0]['seq_len']:,} tokens, vt{tr[0]['vocab_tiling']} + offload" if tr else "replica",
    )
    ax1.legend()
    for name, style in (("plain", "-o"), ("tiled_offloaded", "--x")):
        rr = [r for r in rows if r["run"] == name]
        ax2.plot([r["step"] for r in rr], [r["loss"] for r in rr], style, label=name)
    ax2.set(xlabel="step", ylabel="nats/token", title="tiling + offload vs plain")
    ax2.legend()
    fig.suptitle(note, fontsize=8)
    C.save_figure(fig, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=pathlib.Path, help="gather existing runs in this directory (no training)")
    ap.add_argument(
        "--equal-seq-len",
        type=int,
        default=8192,
        help="tokens per sequence of the tiled-vs-plain pair (default 8192; the plain step at 32768 "
        "does not fit in this machine's RAM)",
    )
    ap.add_argument(
        "--parts",
        nargs="+",
        default=list(runs(0)),
        choices=list(runs(0)),
        help="runs to launch (default all); with --runs, runs already there are not repeated",
    )
    ap.add_argument("--launch", action="store_true", help="with --runs DIR: launch the missing --parts there first")
    args = ap.parse_args(argv)
    sweep = args.runs or C.new_sweep_dir(NAME)
    if args.runs is None or args.launch:
        launch(sweep, args.equal_seq_len, args.parts)
    rows = gather(sweep)
    info = C.load_runs(sweep / "train")[0]["info"]
    C.write_csv(rows, C.RESULTS / f"{NAME}.csv")
    plot(rows, C.RESULTS / f"{NAME}.png", C.machine_note(info))
    for line in check(rows):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
