"""The length-extension study (docs/length_extension.md): a tiny model that retrieves at its
training length L, extended to 4L by five RoPE methods, with and without a short fine-tune,
scored by greedy generation under context parallelism at L, 2L, 4L and 8L.

1. Base: ``python -m lcx.train experiment=retrieval`` (L = 256 tokens of the embedded BPE; the
   task mix ``data=tasks``, train split), or ``--base DIR`` for a finished one.
2. Export: ``python -m lcx.export`` of the base to Hugging Face format (``base_hf``).
3. Fine-tunes: for each method of :data:`METHODS` and each seed, ``python -m lcx.train
   experiment=length_extension_study model.path=base_hf`` with the method's RoPE fields, at 4L
   for ``--steps`` steps; ``long_eval/*`` in its ``metrics.jsonl`` is the score by step.
4. Scores: ``python -m lcx.eval eval=ruler`` of the base with each method applied as is
   (``eval.rope``, no fine-tune) and of every fine-tuned checkpoint: :data:`TASKS` at L..8L,
   ``--depths``, ``--samples`` per cell, and the loss by position of held-out documents to 8L.
   Every example comes from the tasks' eval split (:mod:`lcx.evals.splits`).
5. Results (``experiments/results/``): ``length_extension_study.csv`` (one row per cell: method,
   finetune_steps, seed, train_len, seq_len, task, depth, samples, score on RULER's 0-100 scale,
   with provenance), ``_summary.csv`` (mean score by length and effective length per checkpoint,
   and per method the mean and spread of the seeds), ``_loss.csv`` (loss by position),
   ``_steps.csv`` (score by fine-tune step), ``_middle.csv`` (score by depth of the best
   extended checkpoint at 4L and 8L); figures ``.png`` (score against length, a line per method),
   ``_heatmaps.png``, ``_steps.png`` and ``_middle.png``, copied to docs/.

    python experiments/length_extension_study.py                     # everything (see docs for the time)
    python experiments/length_extension_study.py --base ckpt/retrieval --base-run outputs/retrieval/RUN
    python experiments/length_extension_study.py --runs outputs/length_extension_study/<stamp>   # gather only
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _common as C  # noqa: E402

NAME = "length_extension_study"
TASKS = ("passkey", "niah_single", "niah_multikey", "vt")
DEPTH_TASKS = ("passkey", "niah_single", "niah_multikey")
FACTOR = 4  # the fine-tune's length over the training length
METHODS = ("plain", "pi", "ntk", "yarn", "llama3")
"""plain RoPE; position interpolation (rope_scaling_type=linear, Chen et al. 2023); NTK-aware
(a larger base, bloc97 2023); YaRN (Peng et al. 2023); Llama 3.1's scaling."""
_TYPES = {"plain": None, "pi": "linear", "ntk": "ntk", "yarn": "yarn", "llama3": "llama3"}


def rope_fields(method: str, train_len: int) -> dict[str, Any]:
    """The ``model.rope_*`` fields of ``method`` stretching ``train_len`` tokens by :data:`FACTOR`."""
    kind = _TYPES[method]
    if kind is None:
        return {"rope_scaling_type": None, "rope_scaling_factor": None}
    return {"rope_scaling_type": kind, "rope_scaling_factor": float(FACTOR), "rope_original_max_len": int(train_len)}


def _overrides(prefix: str, fields: Mapping[str, Any]) -> list[str]:
    return [f"{prefix}{k}={'null' if v is None else v}" for k, v in fields.items()]


def _final(ckpt: pathlib.Path) -> int | None:
    steps = [int(p.name) for p in ckpt.glob("*") if p.name.isdigit()] if ckpt.is_dir() else []
    return max(steps) if steps else None


def base(root: pathlib.Path, given: pathlib.Path | None) -> pathlib.Path:
    """The base checkpoint directory: ``given``, else ``root/base`` trained here if absent."""
    if given is not None:
        return given.resolve()
    ckpt = root / "base"
    if _final(ckpt) is None:
        C.run_command(
            [
                sys.executable,
                "-m",
                "lcx.train",
                "experiment=retrieval",
                f"checkpoint.dir={ckpt}",
                f"hydra.run.dir={root / 'base_run'}",
            ]
        )
    return ckpt


def export(root: pathlib.Path, ckpt: pathlib.Path) -> pathlib.Path:
    """The base in Hugging Face format (``root/base_hf``), exported once."""
    out = root / "base_hf"
    if not (out / "config.json").is_file():
        C.run_command(
            [
                sys.executable,
                "-m",
                "lcx.export",
                f"checkpoint.dir={ckpt}",
                f"out={out}",
                f"hydra.run.dir={root / 'export_run'}",
            ]
        )
    return out


def finetune(root: pathlib.Path, hf: pathlib.Path, method: str, seed: int, steps: int, train_len: int) -> pathlib.Path:
    """The fine-tuned checkpoint of ``method`` and ``seed`` (trained once)."""
    tag = f"{method}_s{seed}"
    ckpt = root / "ft" / tag
    if _final(ckpt) != steps:
        C.run_command(
            [
                sys.executable,
                "-m",
                "lcx.train",
                "experiment=length_extension_study",
                f"model.path={hf}",
                *_overrides("model.", rope_fields(method, train_len)),
                f"train.seq_len={FACTOR * train_len}",
                f"train.seed={seed}",
                f"train.steps={steps}",
                f"checkpoint.dir={ckpt}",
                f"hydra.run.dir={root / 'ft_run' / tag}",
            ]
        )
    return ckpt


def evaluate(root: pathlib.Path, tag: str, ckpt: pathlib.Path, rope: Mapping[str, Any] | None, args) -> pathlib.Path:
    """``lcx.eval eval=ruler`` of ``ckpt`` (with ``rope`` applied) into ``root/eval/<tag>``."""
    fields = ",".join(f"{k}:{'null' if v is None else v}" for k, v in (rope or {}).items())
    return C.ruler_eval(
        ckpt,
        root / "eval" / tag,
        tasks=TASKS,
        lengths=[args.train_len * k for k in (1, 2, 4, 8)],
        depths=args.depths,
        per_depth=args.samples,
        perplexity_docs=args.loss_docs,
        extra=[f"eval.rope={{{fields}}}" if rope else "eval.rope=null"],
    )


def conditions(args) -> list[dict[str, Any]]:
    """Every checkpoint scored: each method with no fine-tune, then each method and seed fine-tuned."""
    none = [{"method": m, "finetune_steps": 0, "seed": "", "tag": f"{m}_ft0"} for m in METHODS]
    ft = [
        {"method": m, "finetune_steps": args.steps, "seed": s, "tag": f"{m}_ft{args.steps}_s{s}"}
        for m in METHODS
        for s in args.seeds
    ]
    return none + ft


def run(root: pathlib.Path, args) -> dict[str, float]:
    """Train, export, fine-tune and score everything missing in ``root``; the phases' wall times (s)."""
    times: dict[str, float] = {}
    t = time.perf_counter()
    ckpt = base(root, args.base)
    times["base"], t = time.perf_counter() - t, time.perf_counter()
    hf = export(root, ckpt)
    times["export"], t = time.perf_counter() - t, time.perf_counter()
    ft = {(m, s): finetune(root, hf, m, s, args.steps, args.train_len) for m in METHODS for s in args.seeds}
    times["finetune"], t = time.perf_counter() - t, time.perf_counter()
    for c in conditions(args):
        if c["finetune_steps"] == 0:
            evaluate(
                root, c["tag"], ckpt, rope_fields(c["method"], args.train_len) if c["method"] != "plain" else None, args
            )
        else:
            evaluate(root, c["tag"], ft[(c["method"], c["seed"])], None, args)
    times["score"] = time.perf_counter() - t
    info = {"base": str(ckpt), "base_run": str(args.base_run or root / "base_run"), "times_s": times}
    (root / "study.json").write_text(json.dumps(info, indent=2))
    return times


def _info(run_dir: pathlib.Path) -> dict[str, str]:
    p = run_dir / "run_info.json"
    return C.provenance(json.loads(p.read_text()) if p.is_file() else {})


def gather(root: pathlib.Path, args, docs: pathlib.Path) -> list[dict[str, Any]]:
    """Write every CSV and figure of the run in ``root``; the summary rows."""
    study = json.loads((root / "study.json").read_text())
    L, out = args.train_len, args.out
    cells, summary, loss, steps = [], [], [], []
    for c in conditions(args):
        d = root / "eval" / c["tag"]
        res = json.loads((d / "ruler.json").read_text())
        run_dir = (
            pathlib.Path(study["base_run"])
            if c["finetune_steps"] == 0
            else root / "ft_run" / f"{c['method']}_s{c['seed']}"
        )
        prov = _info(run_dir)
        key = {k: c[k] for k in ("method", "finetune_steps", "seed")}
        for r in C.read_csv(d / "ruler.csv"):
            cells.append({**key, "train_len": L, **r, **prov})
        means = {int(k): float(v) for k, v in res["mean_by_length"].items()}
        eff = res["effective_length"]
        summary.append(
            {
                **key,
                "train_len": L,
                **{f"mean_{s // L}L": means[s] for s in sorted(means)},
                **{f"spread_{s // L}L": "" for s in sorted(means)},  # the seeds' rows only
                "effective_length": eff if eff is not None else "none",
                "threshold": res["threshold"],
                **prov,
            }
        )
        loss += [{**key, **r} for r in C.read_csv(d / "perplexity_by_position.csv")]
        if c["finetune_steps"]:
            for r in C.read_jsonl(run_dir / "metrics.jsonl"):
                if "long_eval/mean" in r:
                    steps.append(
                        {
                            **key,
                            "step": r["step"],
                            **{k[10:]: round(v, 2) for k, v in r.items() if k.startswith("long_eval/")},
                        }
                    )
    summary += seed_spread(summary, L)
    C.write_csv(cells, C.out_file(out, ".csv"))
    C.write_csv(summary, out.parent / f"{out.name}_summary.csv")
    C.write_csv(loss, out.parent / f"{out.name}_loss.csv")
    C.write_csv(steps, out.parent / f"{out.name}_steps.csv")
    middle = lost_in_the_middle(cells, summary, L)
    C.write_csv(middle, out.parent / f"{out.name}_middle.csv")
    figures = [
        plot_lengths(summary, loss, L, C.out_file(out, ".png")),
        plot_heatmaps(cells, L, out.parent / f"{out.name}_heatmaps.png"),
        plot_steps(steps, out.parent / f"{out.name}_steps.png"),
        plot_middle(middle, out.parent / f"{out.name}_middle.png"),
    ]
    for f in figures:
        shutil.copyfile(f, docs / f.name)
        print(f"wrote {C.rel(docs / f.name)}")
    return summary


def seed_spread(summary: Sequence[Mapping[str, Any]], L: int) -> list[dict[str, Any]]:
    """Per fine-tuned method: the seeds' mean score by length and their spread (half the range),
    seed ``mean``; effective length of the seeds' mean curve (RULER's rule over it)."""
    from lcx.evals.scoring import effective_length

    out = []
    for m in METHODS:
        rows = [r for r in summary if r["method"] == m and r["finetune_steps"] and r["seed"] != "mean"]
        if not rows:
            continue
        cols = [k for k in rows[0] if k.startswith("mean_")]
        mean = {k: round(sum(float(r[k]) for r in rows) / len(rows), 2) for k in cols}
        spread = {
            f"spread_{k[5:]}": round((max(float(r[k]) for r in rows) - min(float(r[k]) for r in rows)) / 2, 2)
            for k in cols
        }
        eff = effective_length({int(k[5:-1]) * L: v for k, v in mean.items()}, float(rows[0]["threshold"]))
        out.append(
            {
                "method": m,
                "finetune_steps": rows[0]["finetune_steps"],
                "seed": "mean",
                "train_len": L,
                **mean,
                **spread,
                "effective_length": eff if eff is not None else "none",
                "threshold": rows[0]["threshold"],
                **{k: rows[0][k] for k in ("git_commit", "python", "jax")},
            }
        )
    return out


def _depth_means(cells: Sequence[Mapping[str, Any]], keep) -> dict[tuple[int, float], float]:
    acc: dict[tuple[int, float], list[float]] = {}
    for r in cells:
        if keep(r) and r["task"] in DEPTH_TASKS and r["score"] not in ("", None):
            acc.setdefault((int(r["seq_len"]), float(r["depth"])), []).append(float(r["score"]))
    return {k: sum(v) / len(v) for k, v in acc.items()}


def lost_in_the_middle(cells, summary, L: int) -> list[dict[str, Any]]:
    """Score by needle depth (mean over the depth tasks) at 4L and 8L of the best fine-tuned
    checkpoint (highest mean of its 4L and 8L scores)."""
    ft = [r for r in summary if r["finetune_steps"] and r["seed"] != "mean"]
    best = max(ft, key=lambda r: float(r["mean_4L"]) + float(r["mean_8L"]))
    pick = (best["method"], str(best["finetune_steps"]), str(best["seed"]))
    means = _depth_means(cells, lambda r: (r["method"], str(r["finetune_steps"]), str(r["seed"])) == pick)
    return [
        {"method": pick[0], "finetune_steps": pick[1], "seed": pick[2], "seq_len": s, "depth": d, "score": round(v, 2)}
        for (s, d), v in sorted(means.items())
        if s >= FACTOR * L
    ]


def plot_lengths(summary, loss, L: int, path: pathlib.Path) -> pathlib.Path:
    """Mean score against length, a line per method (solid: fine-tuned, the seeds' mean with their
    range; dashed: no fine-tune), and the held-out loss by position (fine-tuned, seed 0)."""
    plt = C.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12.5, 4.4))
    colors = dict(zip(METHODS, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    lengths = [L * k for k in (1, 2, 4, 8)]
    for r in summary:
        if r["seed"] not in ("mean", ""):
            continue  # the seeds themselves: their mean and range are drawn
        ys = [float(r[f"mean_{k}L"]) for k in (1, 2, 4, 8)]
        ft = r["seed"] == "mean"
        err = [float(r[f"spread_{k}L"]) for k in (1, 2, 4, 8)] if ft else None
        a.errorbar(
            lengths,
            ys,
            yerr=err,
            fmt="o-" if ft else "s--",
            color=colors[r["method"]],
            alpha=1 if ft else 0.6,
            label=f"{r['method']}, {r['finetune_steps']} steps" if ft else f"{r['method']}, no fine-tune",
            capsize=3,
        )
    a.axhline(85.6, color="gray", lw=0.8, ls=":")
    a.set_xscale("log", base=2)
    a.set_xticks(lengths, [str(x) for x in lengths])
    a.set_ylim(-3, 103)
    a.set_xlabel(f"context length (tokens; trained at {L}, fine-tuned at {FACTOR * L})")
    a.set_ylabel("mean score, 0-100 (" + ", ".join(TASKS) + ")")
    a.set_title("score by generation (dotted: RULER's 85.6)")
    a.legend(fontsize=7, ncol=2)
    first = min((r["seed"] for r in loss if r["seed"] != ""), default="")
    for m in METHODS:
        rows = [r for r in loss if r["method"] == m and r["seed"] == first]
        xs = [(float(r["bin_start"]) + float(r["bin_end"])) / 2 for r in rows]
        b.plot(xs, [float(r["nll"]) for r in rows], "o-", color=colors[m], label=m, ms=3)
    for k in (1, FACTOR):
        b.axvline(k * L, color="gray", lw=0.8, ls=":")
    b.set_xlabel("token position (dotted: L and 4L)")
    b.set_ylabel("loss (nats/token)")
    b.set_title("held-out loss by position, fine-tuned")
    b.legend(fontsize=8)
    return C.save_figure(fig, path)


def plot_heatmaps(cells, L: int, path: pathlib.Path) -> pathlib.Path:
    """Score by length x needle depth (mean of the depth tasks), per method, without (top) and with
    (bottom, the first seed) the fine-tune."""
    plt = C.pyplot()
    fig, axes = plt.subplots(2, len(METHODS), figsize=(3.1 * len(METHODS), 5.6), sharey=True)
    lengths = [L * k for k in (1, 2, 4, 8)]
    seeds = sorted({r["seed"] for r in cells if r["seed"] != ""})
    im = None
    for j, m in enumerate(METHODS):
        for i, (steps, seed) in enumerate(((0, ""), (None, seeds[0] if seeds else ""))):
            keep = lambda r, m=m, seed=seed, steps=steps: (
                r["method"] == m and r["seed"] == seed and (steps is None or str(r["finetune_steps"]) == str(steps))
            )
            means = _depth_means(cells, keep)
            depths = sorted({d for _, d in means})
            grid = [[means.get((s, d), float("nan")) for s in lengths] for d in depths]
            ax = axes[i][j]
            im = ax.imshow(grid, vmin=0, vmax=100, cmap="viridis", aspect="auto")
            for y, row in enumerate(grid):
                for x, v in enumerate(row):
                    ax.text(x, y, f"{v:.0f}", ha="center", va="center", fontsize=7, color="w" if v < 60 else "k")
            ax.set_xticks(range(len(lengths)), [str(s) for s in lengths], fontsize=7)
            ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
            ax.set_title(f"{m}, {'no fine-tune' if i == 0 else 'fine-tuned, seed ' + str(seed)}", fontsize=8)
            if j == 0:
                ax.set_ylabel("needle depth")
    fig.colorbar(im, ax=axes, shrink=0.6, label="score (0-100)")
    return C.save_figure(fig, path)


def plot_steps(steps, path: pathlib.Path) -> pathlib.Path:
    """The long-eval mean score at 4L by fine-tune step, a line per method and seed."""
    plt = C.pyplot()
    fig, a = plt.subplots(figsize=(6.5, 4))
    colors = dict(zip(METHODS, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for m in METHODS:
        for s in sorted({r["seed"] for r in steps if r["method"] == m}):
            rows = sorted((r for r in steps if r["method"] == m and r["seed"] == s), key=lambda r: int(r["step"]))
            a.plot(
                [int(r["step"]) for r in rows],
                [float(r["mean"]) for r in rows],
                "o-",
                color=colors[m],
                ms=3,
                alpha=0.9 if s == 0 else 0.5,
                label=f"{m} seed {s}",
            )
    a.axhline(85.6, color="gray", lw=0.8, ls=":")
    a.set_ylim(-3, 103)
    a.set_xlabel("fine-tune step")
    a.set_ylabel("mean score at 4L (niah_single, niah_multikey, vt)")
    a.set_title("score by step during the fine-tune (2 samples x 2 depths)")
    a.legend(fontsize=6, ncol=2)
    return C.save_figure(fig, path)


def plot_middle(middle, path: pathlib.Path) -> pathlib.Path:
    """Score by needle depth at 4L and 8L of the best fine-tuned checkpoint."""
    plt = C.pyplot()
    fig, a = plt.subplots(figsize=(5.5, 3.8))
    for s in sorted({int(r["seq_len"]) for r in middle}):
        rows = [r for r in middle if int(r["seq_len"]) == s]
        a.plot([float(r["depth"]) for r in rows], [float(r["score"]) for r in rows], "o-", label=f"{s} tokens")
    m = middle[0] if middle else {"method": "?", "seed": "?"}
    a.set_ylim(-3, 103)
    a.set_xlabel("needle depth (0: start of the haystack)")
    a.set_ylabel("mean score (" + ", ".join(DEPTH_TASKS) + ")")
    a.set_title(f"score by depth: {m['method']}, fine-tuned, seed {m['seed']}")
    a.legend()
    return C.save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=pathlib.Path, help="gather this finished run directory instead of running")
    ap.add_argument("--root", type=pathlib.Path, help="run (or finish) in this directory instead of a new one")
    ap.add_argument("--base", type=pathlib.Path, help="a finished experiment=retrieval checkpoint.dir (else trained)")
    ap.add_argument("--base-run", type=pathlib.Path, help="its run directory (run_info.json: provenance)")
    ap.add_argument("--train-len", type=int, default=256, help="L, the base's training length (tokens)")
    ap.add_argument("--steps", type=int, default=100, help="fine-tune steps at 4L")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="fine-tune seeds")
    ap.add_argument("--samples", type=int, default=20, help="samples per (task, length, depth)")
    ap.add_argument("--depths", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0])
    ap.add_argument("--loss-docs", type=int, default=4, help="held-out documents of the loss by position")
    ap.add_argument("--out", type=pathlib.Path, default=C.RESULTS / NAME, help="result file stem")
    ap.add_argument("--docs", type=pathlib.Path, default=C.ROOT / "docs", help="where the figures are copied")
    args = ap.parse_args(argv)
    if args.runs is None:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        root = (args.root or C.ROOT / "outputs" / NAME / stamp).resolve()
        root.mkdir(parents=True, exist_ok=True)
        # one compilation cache for every command: the seeds and methods share programs
        os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(root / "jax_cache"))
        start = time.perf_counter()
        times = run(root, args)
        print(
            "phase wall times (s):",
            {k: round(v) for k, v in times.items()},
            "total",
            round(time.perf_counter() - start),
        )
    else:
        root = args.runs.resolve()
        if not (root / "study.json").is_file():
            print(f"--runs {root}: no study.json; give a directory this script wrote", file=sys.stderr)
            return 2
    gather(root, args, args.docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
