"""Experiment (e): a tiny model learns passkey retrieval at 1024 tokens under ring attention.

Trains ``python -m lcx.extend experiment=passkey`` (conf/experiment/passkey.yaml: the tiny
Llama with 4 kv heads, 2-way data x 4-way ring context parallelism with the zigzag layout on 8 simulated CPU
devices, data=passkey from lcx/data/passkey.py; a three-stage schedule, 256 -> 512 -> 1024
tokens), then loads the final checkpoint and measures,
on held-out rows at each depth of ``data.eval_depths``, the teacher-forced argmax of each
answer digit (the question and the previous answer digits are given; the model must produce
each digit): ``exact_match`` (all digits right), ``digit_accuracy`` and ``digit_<i>`` (accuracy
of the i-th answer digit). Chance is 1e-5 and 0.1.

Writes ``experiments/results/passkey.csv`` (accuracy by depth) and ``.png`` (accuracy by depth,
and the training / validation loss on the answer digits by step).

    python experiments/passkey.py                       # train + evaluate, ~50 min on 2 busy cores
    python experiments/passkey.py schedule.stages.0.steps=100   # shorter (Hydra overrides pass through)
    python experiments/passkey.py --run-dir outputs/passkey/<stamp>   # evaluate an existing run
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _common as C  # noqa: E402

NAME = "passkey"


def train(overrides) -> pathlib.Path:
    """Run the experiment's length-extension schedule (``python -m lcx.extend``); its run dir."""
    run_dir = C.ROOT / "outputs" / NAME / datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    cmd = [sys.executable, "-m", "lcx.extend", f"experiment={NAME}", f"hydra.run.dir={run_dir}", *overrides]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=C.ROOT, check=True)
    return run_dir


def stage_dirs(run_dir: pathlib.Path) -> list[pathlib.Path]:
    """The training run directories of ``run_dir`` in order: the stages of an ``lcx.extend`` run
    (from its ``schedule.json``), or ``run_dir`` itself for an ``lcx.train`` run."""
    sched = run_dir / "schedule.json"
    if not sched.exists():
        return [run_dir]
    return [pathlib.Path(s["run_dir"]) for s in json.loads(sched.read_text())]


def stage_metrics(run_dir: pathlib.Path) -> list[dict]:
    """metrics.jsonl of every stage, concatenated (steps continue across stages), each row
    tagged with its stage's sequence length."""
    out = []
    for d in stage_dirs(run_dir):
        seq = json.loads((d / "run_info.json").read_text())["config"]["train"]["seq_len"]
        out.extend({**m, "seq_len": int(seq)} for m in C.read_jsonl(d / "metrics.jsonl"))
    return out


RUN_DIR_HELP = (
    "the run directory of a finished `python -m lcx.extend experiment=passkey` run (it holds "
    "schedule.json; this script's own runs are outputs/passkey/<stamp>) or of an `lcx.train` run "
    "(run_info.json) that saved checkpoints (checkpoint.dir set)"
)


def run_dir_problem(run_dir: pathlib.Path) -> str | None:
    """Why ``run_dir`` cannot be evaluated (a one-line message naming the path and what is
    expected there), or None when it can."""
    if not run_dir.is_dir():
        return f"--run-dir {run_dir}: {'not a directory' if run_dir.exists() else 'does not exist'}; expected {RUN_DIR_HELP}"
    try:
        stages = stage_dirs(run_dir)
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"--run-dir {run_dir}: unreadable schedule.json ({e}); expected {RUN_DIR_HELP}"
    last = stages[-1]
    info_path = last / "run_info.json"
    if not info_path.is_file():
        return f"--run-dir {run_dir}: no run_info.json in {last}; expected {RUN_DIR_HELP}"
    try:
        ckpt = json.loads(info_path.read_text()).get("checkpoint_dir")
    except (OSError, ValueError) as e:
        return f"--run-dir {run_dir}: unreadable {info_path} ({e}); expected {RUN_DIR_HELP}"
    if not ckpt:
        return f"--run-dir {run_dir}: the run saved no checkpoint (checkpoint.dir was null) to evaluate; expected {RUN_DIR_HELP}"
    if not pathlib.Path(ckpt).is_dir():
        return f"--run-dir {run_dir}: its checkpoint directory {ckpt} does not exist; expected {RUN_DIR_HELP}"
    return None


def evaluate(run_dir: pathlib.Path, per_depth: int) -> tuple[list[dict], dict]:
    """Accuracy by depth of the run's final checkpoint on fresh evaluation rows."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    info = json.loads((run_dir / "run_info.json").read_text())
    cfg = info["config"]
    jax.config.update("jax_num_cpu_devices", int(cfg["hardware"]["cpu_devices"]))
    import equinox as eqx
    import numpy as np

    from lcx.data.passkey import PasskeyEval
    from lcx.sharding import bind
    from lcx.sharding.config import plan_from_dict
    from lcx.sharding.layout import undo_layout
    from lcx.training.resume import load_model
    from lcx.training.stepping import put_batch

    devices = jax.devices()[: int(cfg["hardware"]["cpu_devices"])]
    h = cfg["hardware"]
    plan = plan_from_dict(cfg["plan"], default_block=h["attention_block"], default_kernel=h["attention_kernel"])
    mp = bind(plan, devices)
    model, meta = load_model(info["checkpoint_dir"], mp)
    S, B, d = int(cfg["train"]["seq_len"]), int(cfg["train"]["global_batch"]), cfg["data"]
    ev = PasskeyEval(
        seq_len=S,
        global_batch=B,
        layout=plan.attention.layout,
        context_degree=mp.context_degree,
        digits=int(d["digits"]),
        depths=[float(x) for x in d["eval_depths"]],
        per_depth=per_depth,
        seed=int(d["split_seed"]) + 1,
    )  # +1: rows unseen by the in-training validation too
    sharding = mp.activation_sharding(("batch", "seq"))

    @eqx.filter_jit
    def predict(m, batch):
        return m(batch["tokens"], batch["positions"], batch["segment_ids"], plan=mp).argmax(-1)

    preds = []
    for i in range(len(ev)):
        p = np.asarray(predict(model, put_batch(ev[i], sharding)))
        preds.extend(undo_layout(p, plan.attention.layout, mp.context_degree, axis=-1))
    by_depth: dict[float, list] = {}
    for ex, pred in zip(ev.examples, preds):
        got = pred[ex.answer_pos]
        want = ex.arrays["targets"][ex.answer_pos]
        by_depth.setdefault(ex.depth, []).append((got == want, int(ex.answer_pos[0] - ex.key_pos)))
    rows = []
    for depth, res in sorted(by_depth.items()):
        ok = np.array([r[0] for r in res])
        rows.append(
            {
                "depth": depth,
                "key_to_answer_tokens": int(np.mean([r[1] for r in res])),
                "rows": len(res),
                "exact_match": float(ok.all(axis=1).mean()),
                "digit_accuracy": float(ok.mean()),
                # accuracy of the i-th answer digit (which digits fail tells the mechanism apart)
                **{f"digit_{i + 1}": float(ok[:, i].mean()) for i in range(ok.shape[1])},
            }
        )
    loss_on = (
        "every token"
        if d.get("loss_on", "answer") == "all"
        else ("answer + key repeat" if d.get("recall_loss") else "answer digits")
    )
    summary = {
        "step": int(meta["step"]),
        "seq_len": S,
        "loss_on": loss_on,
        "plan": plan.name,
        "strategy": plan.attention.strategy,
        "context_degree": mp.context_degree,
        **C.provenance(info),
    }
    return rows, summary


def plot(rows, metrics, summary, path: pathlib.Path) -> pathlib.Path:
    plt = C.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    x = [float(r["depth"]) for r in rows]
    a.plot(x, [float(r["exact_match"]) for r in rows], "o-", label="exact match (5 digits)")
    a.plot(x, [float(r["digit_accuracy"]) for r in rows], "s--", label="per-digit accuracy")
    a.axhline(0.1, color="gray", lw=0.8, ls=":", label="per-digit chance")
    a.set_ylim(-0.03, 1.03)
    a.set_xlabel("passkey depth (0: start of the context, 1: just before the question)")
    a.set_ylabel("accuracy")
    a.set_title(
        f"retrieval at {summary['seq_len']} tokens, {summary['strategy']} x{summary['context_degree']}, "
        f"step {summary['step']}"
    )
    a.legend(fontsize=8)
    a.grid(alpha=0.3)
    steps = [m["step"] for m in metrics]
    b.plot(steps, [m["loss"] for m in metrics], lw=0.8, label=f"train loss ({summary['loss_on']})")
    v = [(m["step"], m["val_loss"]) for m in metrics if m.get("val_loss") is not None]
    if v:
        b.plot(*zip(*v), "o-", label="validation loss (answer digits)")
    b.set_yscale("log")  # losses span 1e-3 .. 7 nats: a linear axis hides every stage's end
    b.axhline(2.302585, color="gray", lw=0.8, ls=":", label="ln 10 (guessing digits)")
    changes = [(prev, m) for prev, m in zip(metrics, metrics[1:]) if m.get("seq_len") != prev.get("seq_len")]
    for n, (prev, m) in enumerate(changes):
        b.axvline(m["step"] - 0.5, color="k", lw=0.8, ls="--")
        # stacked labels: stage boundaries can be close together
        b.annotate(
            f"{prev['seq_len']} -> {m['seq_len']} tokens",
            (m["step"], 1.0 - 0.06 * n),
            fontsize=7,
            ha="left",
            va="top",
            xycoords=("data", "axes fraction"),
        )
    b.set_xlabel("step")
    b.set_ylabel("nats / loss-bearing token")
    b.set_title("training")
    b.legend(fontsize=8)
    b.grid(alpha=0.3)
    fig.suptitle(f"passkey retrieval, tiny Llama ({C.machine_note()})")
    return C.save_figure(fig, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=pathlib.Path, help="evaluate this finished run instead of training")
    ap.add_argument("--per-depth", type=int, default=16, help="evaluation rows per depth")
    ap.add_argument("--out", type=pathlib.Path, default=C.RESULTS / NAME)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for the training run")
    a = ap.parse_args(argv)
    if a.run_dir:
        run_dir = a.run_dir if a.run_dir.is_absolute() else C.ROOT / a.run_dir
        problem = run_dir_problem(run_dir)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    else:
        run_dir = train(a.overrides)
    rows, summary = evaluate(stage_dirs(run_dir)[-1], a.per_depth)
    for r in rows:
        r.update(
            step=summary["step"],
            seq_len=summary["seq_len"],
            strategy=summary["strategy"],
            context_degree=summary["context_degree"],
            **{k: summary[k] for k in ("git_commit", "python", "jax")},
        )
    C.write_csv(rows, C.out_file(a.out, ".csv"))
    plot(rows, stage_metrics(run_dir), summary, C.out_file(a.out, ".png"))
    for r in rows:
        print(f"depth {r['depth']:.1f}: exact match {r['exact_match']:.2f}, digits {r['digit_accuracy']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
