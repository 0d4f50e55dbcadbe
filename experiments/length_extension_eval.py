"""Length extension, scored by generation: a tiny model trained short, extended with and without
YaRN, evaluated at 1x, 2x, 4x and 8x its first length (issue 42, item 6).

Runs ``python -m lcx.extend experiment=length_extension`` (conf/experiment/length_extension.yaml)
at CPU scale on the embedded BPE corpus (``data=stdlib_bpe``), its first stage shortened to
``--first`` tokens and its second at 4x that:

- ``short``: the first stage's checkpoint alone (plain RoPE, never trained past ``--first``);
- ``yarn``: the schedule as committed, the second stage with YaRN x4 over ``--first`` tokens;
- ``plain``: the same second stage from the same first-stage checkpoint, with plain RoPE
  (``schedule.stages.1.model.rope_scaling_type=null``; an override ``model={}`` would merge
  into the stage's YaRN fields, not replace them): extension by training alone.

Each checkpoint is scored by ``python -m lcx.eval eval=ruler`` (greedy generation under the
checkpoint's own plan; :mod:`lcx.evals`) on ``passkey``, ``niah_single`` and ``vt`` at 1x-8x
``--first``, plus the loss by position of held-out documents at 8x. Writes
``experiments/results/length_extension_eval.csv`` (one row per condition, task, length and depth:
the score, a fraction; with the run's provenance), ``length_extension_eval_summary.csv`` (mean
score by length, effective length, per condition), ``length_extension_eval_loss.csv`` (loss by
position, nats/token), ``length_extension_eval.png`` (both curves, copied to docs/), and each
condition's heat map as ``docs/length_extension_<condition>_heatmap.png``.

    python experiments/length_extension_eval.py                  # train + evaluate, ~20 min on 2 cores
    python experiments/length_extension_eval.py --runs outputs/length_extension_eval/<stamp>  # gather only
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import shutil
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _common as C  # noqa: E402

NAME = "length_extension_eval"
CONDITIONS = ("short", "plain", "yarn")
TASKS = ("passkey", "niah_single", "vt")


def _train_overrides(first: int, steps: tuple[int, int], batch: int) -> list[str]:
    """The schedule's overrides: stage 0 at ``first`` tokens, stage 1 at 4x with the same tokens
    per step (``batch`` rows, then ``batch // 4``)."""
    return [
        "experiment=length_extension",
        "data=stdlib_bpe",
        "plan=ring",
        f"schedule.stages.0.seq_len={first}",
        f"schedule.stages.0.steps={steps[0]}",
        f"+schedule.stages.0.global_batch={batch}",
        f"schedule.stages.1.seq_len={4 * first}",
        f"schedule.stages.1.steps={steps[1]}",
        f"+schedule.stages.1.global_batch={max(batch // 4, 2)}",
        f"schedule.stages.1.model.rope_original_max_len={first}",
        "train.eval_every=0",
        "checkpoint.every=0",  # a checkpoint at the end of each stage
        "checkpoint.keep=3",
    ]


PLAIN = [  # stage 1 without RoPE scaling: the fields a plain tiny model has
    "schedule.stages.1.model.rope_scaling_type=null",
    "schedule.stages.1.model.rope_scaling_factor=null",
    "schedule.stages.1.model.rope_original_max_len=8192",
]


def train(root: pathlib.Path, first: int, steps: tuple[int, int], batch: int) -> None:
    """The ``yarn`` schedule, then the ``plain`` second stage from a copy of its first stage; a
    schedule whose final checkpoint exists in ``root`` is not run again."""
    base = _train_overrides(first, steps, batch)
    yarn, plain = root / "ckpt_yarn", root / "ckpt_plain"
    if not (yarn / str(sum(steps))).is_dir():
        C.run_command(
            [
                sys.executable,
                "-m",
                "lcx.extend",
                *base,
                f"checkpoint.dir={yarn}",
                f"hydra.run.dir={root / 'train_yarn'}",
            ]
        )
    if not (plain / str(sum(steps))).is_dir():
        plain.mkdir(parents=True, exist_ok=True)
        if not (plain / str(steps[0])).is_dir():
            shutil.copytree(yarn / str(steps[0]), plain / str(steps[0]))  # stage 0 is shared: it is skipped
        C.run_command(
            [
                sys.executable,
                "-m",
                "lcx.extend",
                *base,
                *PLAIN,
                f"checkpoint.dir={plain}",
                f"hydra.run.dir={root / 'train_plain'}",
            ]
        )


def evaluate(root: pathlib.Path, first: int, step0: int, per_depth: int) -> None:
    """``lcx.eval eval=ruler`` of each condition's checkpoint, in ``root/eval_<condition>``."""
    for cond in CONDITIONS:
        C.ruler_eval(
            root / ("ckpt_plain" if cond == "plain" else "ckpt_yarn"),
            root / f"eval_{cond}",
            tasks=TASKS,
            lengths=[first * k for k in (1, 2, 4, 8)],
            depths=[0, 0.5, 1],
            per_depth=per_depth,
            perplexity_docs=8,
            extra=[*([f"checkpoint.step={step0}"] if cond == "short" else []), "eval.perplexity_bins=16"],
        )


def _provenance(root: pathlib.Path) -> dict[str, str]:
    """The training run's provenance (its last stage's ``run_info.json``)."""
    sched = json.loads((root / "train_yarn" / "schedule.json").read_text())
    info = json.loads((pathlib.Path(sched[-1]["run_dir"]) / "run_info.json").read_text())
    return C.provenance(info)


def gather(root: pathlib.Path, out: pathlib.Path, first: int, docs: pathlib.Path = C.ROOT / "docs") -> list[dict]:
    """Write the CSVs and the figure of the run in ``root`` (stem ``out``), and copy the figure and
    the heat maps into ``docs``; the summary rows (mean score by length, effective length)."""
    prov = _provenance(root)
    cells, summary, loss = [], [], []
    for cond in CONDITIONS:
        d = root / f"eval_{cond}"
        res = json.loads((d / "ruler.json").read_text())
        for r in C.read_csv(d / "ruler.csv"):
            cells.append({"condition": cond, "first_len": first, **r, **prov})
        means = {int(k): float(v) for k, v in res["mean_by_length"].items()}
        summary.append(
            {
                "condition": cond,
                "first_len": first,
                **{f"mean_{s // first}x": means[s] for s in sorted(means)},
                "effective_length": res["effective_length"] if res["effective_length"] is not None else "none",
                "threshold": res["threshold"],
                **prov,
            }
        )
        for r in C.read_csv(d / "perplexity_by_position.csv"):
            loss.append({"condition": cond, **r})
        shutil.copyfile(d / "ruler_heatmap.png", docs / f"length_extension_{cond}_heatmap.png")
        print(f"wrote {C.rel(docs / f'length_extension_{cond}_heatmap.png')}")
    C.write_csv(cells, C.out_file(out, ".csv"))
    C.write_csv(summary, out.parent / f"{out.name}_summary.csv")
    C.write_csv(loss, out.parent / f"{out.name}_loss.csv")
    shutil.copyfile(plot(summary, loss, first, C.out_file(out, ".png")), docs / "length_extension_eval.png")
    print(f"wrote {C.rel(docs / 'length_extension_eval.png')}")
    return summary


def plot(summary, loss, first: int, path: pathlib.Path) -> pathlib.Path:
    """Mean score by length (left) and loss by position (right), one line per condition."""
    plt = C.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    for s in summary:
        xs = sorted(int(k[5:-1]) for k in s if k.startswith("mean_"))
        a.plot([x * first for x in xs], [s[f"mean_{x}x"] for x in xs], "o-", label=s["condition"])
    a.set_xscale("log", base=2)
    a.set_ylim(-3, 103)  # RULER's percentages (lcx.evals.scoring)
    a.set_xlabel("context length (tokens)")
    a.set_ylabel(f"mean score, 0-100 ({', '.join(TASKS)})")
    a.set_title("RULER tasks by generation")
    a.legend()
    for cond in CONDITIONS:
        rows = [r for r in loss if r["condition"] == cond]
        a_x = [(float(r["bin_start"]) + float(r["bin_end"])) / 2 for r in rows]
        b.plot(a_x, [float(r["nll"]) for r in rows], "o-", label=cond)
    for k in (1, 4):
        b.axvline(k * first, color="gray", lw=0.8, ls=":")
    b.set_xlabel("token position (dotted: 1x and 4x the first length)")
    b.set_ylabel("loss (nats/token)")
    b.set_title("held-out loss by position")
    b.legend()
    return C.save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=pathlib.Path, help="gather this finished run directory instead of running")
    ap.add_argument("--root", type=pathlib.Path, help="run (or finish) in this directory instead of a new one")
    ap.add_argument("--first", type=int, default=256, help="the first stage's length (tokens)")
    ap.add_argument("--steps", type=int, nargs=2, default=(200, 50), help="steps of the two stages")
    ap.add_argument("--batch", type=int, default=8, help="rows per step of the first stage")
    ap.add_argument("--per-depth", type=int, default=2, help="samples per task, length and depth")
    ap.add_argument("--out", type=pathlib.Path, default=C.RESULTS / NAME, help="result file stem")
    ap.add_argument("--docs", type=pathlib.Path, default=C.ROOT / "docs", help="where the figures are copied")
    args = ap.parse_args(argv)
    if args.runs is None:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        root = (args.root or C.ROOT / "outputs" / NAME / stamp).resolve()
        train(root, args.first, tuple(args.steps), args.batch)
        evaluate(root, args.first, args.steps[0], args.per_depth)
    else:
        root = args.runs.resolve()
        if not (root / "eval_yarn" / "ruler.json").is_file():
            print(f"--runs {root}: no eval_yarn/ruler.json; give a directory this script wrote", file=sys.stderr)
            return 2
    gather(root, args.out, args.first, args.docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
