"""Issue 21 item 3: the ``cpu`` preset's calibrated step time against real ``lcx.train`` steps.

The ``cpu`` preset's :class:`~lcx.cost.timing.TimeModel` comes from short probes of this
machine (:mod:`lcx.cost.probes`: a matmul, the XLA attention kernel, a collective, the
optimizer update), never from these runs. This script is the hold-out check: it trains

- models ``tiny`` and ``small`` (tiny widened: d_model 256, 4 layers, MLP 768, 8 heads,
  2 KV heads),
- strategies ``allgather``, ``a2a``, ``ring``, ``usp`` (conf/plan/*.yaml, 8 simulated devices),
- sequence lengths 2,048 and 4,096 tokens (global batch 2),
- remat ``none`` and ``full``,

each as ``python -m lcx.train`` in its own subprocess for a few steps, takes the steady-state
step (median ``step_time_s`` after the first two steps of ``metrics.jsonl``) and compares it
with :func:`lcx.cost.estimate` of the same model, plan, policy and sizes on the probed preset.

Writes ``experiments/results/step_time_cpu.csv`` (``error`` = predicted / measured - 1) and
``.png``; prints the median |error| and, for every (model, seq_len, remat) group, each pair of
strategies whose measured steps differ by more than 15% with whether the prediction orders it
the same way. Targets: median |error| <= 20%, every such pair ordered as measured.

    python experiments/step_time_cpu.py                   # the grid (~25 min on 2 cores)
    python experiments/step_time_cpu.py --runs DIR        # gather existing runs only
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import pathlib
import shutil
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _common as C  # noqa: E402

from lcx.cost.probes import busy_cpu_s, run_with_load  # noqa: E402

NAME = "step_time_cpu"
MODELS = {
    "tiny": ["model=tiny"],
    "small": [
        "model=tiny",
        "model.d_model=256",
        "model.n_layers=4",
        "model.mlp_dim=768",
        "model.n_heads=8",
        "model.n_kv_heads=2",
    ],
}
STRATEGIES = ("allgather", "a2a", "ring", "usp")
SEQ_LENS = (2048, 4096)
REMATS = ("none", "full")
STEPS, SKIP = 6, 2  # steps per run; the first SKIP (compile, warm-up) are not steady state
COMMON = [f"train.steps={STEPS}", "train.eval_every=0", "train.tensorboard=false", "train.global_batch=2"]


# the attention block: 512 tokens (the cpu preset's), but never more than the zigzag chunk
# S / (2P) (P = 4 in every plan here): a block straddling a shard's two chunks makes every tile
# partial, so the kernel skips nothing (lcx.attention.strategies.ring), which the ledger's
# causal block waste 1 + block / S does not price (docs/time_model_cpu.md)
def block(seq_len: int) -> int:
    return min(512, seq_len // 8)


QUIET = 0.1  # runs beside other processes that used less of the machine than this are "quiet"
RANK_GAP = 0.15  # measured steps this far apart must be ordered the same by the prediction


def grid() -> list[tuple[str, str, int, str]]:
    """(model, strategy, seq_len, remat) of every run."""
    return list(itertools.product(MODELS, STRATEGIES, SEQ_LENS, REMATS))


def run_name(model: str, strategy: str, seq_len: int, remat: str) -> str:
    return f"{model}-{strategy}-{seq_len}-{remat}"


def launch(sweep: pathlib.Path, rerun_above: float | None = None) -> None:
    """Train every grid point not already under ``sweep`` (a rerun resumes the grid).

    Each run's ``load.json`` records its wall and CPU seconds and the share of the machine other
    processes used meanwhile (``foreign_share``: busy CPU time not the run's, over wall time x
    cores): the simulated devices share the cores with everything else on the machine, so a run
    beside another job measures both. ``rerun_above``: train again the runs whose share exceeds it
    (or is unknown), each once the machine is quiet (:func:`wait_quiet`).
    """
    for model, strategy, seq_len, remat in grid():
        d = sweep / run_name(model, strategy, seq_len, remat)
        if (d / "metrics.jsonl").exists():
            share = _load(d).get("foreign_share")
            if rerun_above is None or (share is not None and share <= rerun_above):  # unknown: again
                continue
            shutil.rmtree(d)
            wait_quiet()
        b = block(seq_len)
        ov = [*MODELS[model], f"plan={strategy}", f"train.seq_len={seq_len}", f"model.remat={remat}", *COMMON]
        ov += [f"plan.attention.block_q={b}", f"plan.attention.block_kv={b}"]
        cmd = [sys.executable, "-m", "lcx.train", f"hydra.run.dir={d}", *ov]
        print("+", " ".join(cmd), flush=True)
        _, load = run_with_load(cmd, cwd=C.ROOT, check=True)
        (d / "load.json").write_text(json.dumps(load))


def wait_quiet(limit_s: float = 60.0, window_s: float = 3.0) -> float:
    """Wait (at most ``limit_s`` seconds) until other processes use less than :data:`QUIET` of
    the machine over ``window_s``; the share last seen."""
    t0, share = time.perf_counter(), 1.0
    while time.perf_counter() - t0 < limit_s:
        b0 = busy_cpu_s()
        time.sleep(window_s)
        share = (busy_cpu_s() - b0) / (window_s * (os.cpu_count() or 1))
        if share < QUIET:
            break
    return share


def _load(d: pathlib.Path) -> dict:
    return json.loads((d / "load.json").read_text()) if (d / "load.json").exists() else {}


def predict(cfg: dict, hw) -> tuple[float, float]:
    """(calibrated, roofline) step seconds of :func:`lcx.cost.estimate` for a run's config."""
    from lcx.config.run import data_config, model_config
    from lcx.cost import estimate
    from lcx.cost.local import StepSizes
    from lcx.data.tokenizers import data_tokenizer
    from lcx.sharding.config import plan_from_dict
    from lcx.training.memory import MemoryOptions, memory_policy

    h = cfg["hardware"]
    plan = plan_from_dict(cfg["plan"], default_block=h["attention_block"], default_kernel=h["attention_kernel"])
    m = model_config(cfg["model"], data_tokenizer(data_config(cfg["data"])))  # vocab_size: null derived
    policy = memory_policy(m, MemoryOptions(**(cfg.get("memory") or {})))
    step = StepSizes.of_model(m, int(cfg["train"]["seq_len"]), int(cfg["train"]["global_batch"])).args()
    n = int(cfg["hardware"]["cpu_devices"])
    e = estimate(m, plan, hw, n, policy=policy, window=m.sliding_window, **step)
    return e.step_time, e.roofline_step_time


def probed_cpu(n_devices: int = 8):
    """The ``cpu`` preset as conf/hardware/cpu.yaml is now, its time model probed (cached)."""
    from lcx.cost import hardware_from_config

    return hardware_from_config(C.compose(overrides=["hardware=cpu"]).hardware, n_devices, probe_time_model=True)


def gather(sweep: pathlib.Path, hw=None) -> list[dict]:
    """One row per grid point found under ``sweep``, with its measured and predicted step
    (``hw``: the preset to predict with; default :func:`probed_cpu`)."""
    rows = []
    for model, strategy, seq_len, remat in grid():
        name = run_name(model, strategy, seq_len, remat)
        runs = C.load_runs(sweep / name) if (sweep / name).exists() else []
        if not runs or len(runs[0]["metrics"]) <= SKIP:
            continue
        run = runs[0]
        cfg = run["config"]
        hw = hw or probed_cpu(int(cfg["hardware"]["cpu_devices"]))
        steady = [r["step_time_s"] for r in run["metrics"][SKIP:]]
        measured = statistics.median(steady)
        predicted, roofline = predict(cfg, hw)
        rows.append(
            {
                "model": model,
                "strategy": strategy,
                "seq_len": seq_len,
                "remat": remat,
                "measured_s": measured,
                "fastest_s": min(steady),
                "predicted_s": predicted,
                "roofline_s": roofline,
                "error": predicted / measured - 1,
                "roofline_error": roofline / measured - 1,
                "steps_timed": len(steady),
                "foreign_share": _load(run["dir"]).get("foreign_share", math.nan),
                "spread": (max(steady) - min(steady)) / measured,
                **C.provenance(run["info"]),
            }
        )
    return rows


def ranking(rows: list[dict], gap: float = RANK_GAP) -> list[dict]:
    """Every pair of strategies in one (model, seq_len, remat) group whose measured steps differ
    by more than ``gap`` (relative to the faster), and whether the prediction orders it alike."""
    out = []
    key = lambda r: (r["model"], r["seq_len"], r["remat"])  # noqa: E731
    for k, group in itertools.groupby(sorted(rows, key=key), key=key):
        for a, b in itertools.combinations(list(group), 2):
            fast, slow = sorted((a, b), key=lambda r: r["measured_s"])
            if slow["measured_s"] / fast["measured_s"] - 1 <= gap:
                continue
            out.append(
                {
                    "group": "/".join(str(x) for x in k),
                    "faster": fast["strategy"],
                    "slower": slow["strategy"],
                    "measured_ratio": slow["measured_s"] / fast["measured_s"],
                    "predicted_ratio": slow["predicted_s"] / fast["predicted_s"],
                    "same_order": slow["predicted_s"] > fast["predicted_s"],
                }
            )
    return out


def check(rows: list[dict]) -> list[str]:
    """The experiment's verdicts, one line each."""
    errs = sorted(abs(r["error"]) for r in rows)
    med = statistics.median(errs)
    roof = statistics.median(abs(r["roofline_error"]) for r in rows)
    worst = sorted(rows, key=lambda r: -abs(r["error"]))[:3]
    pairs = ranking(rows)
    bad = [p for p in pairs if not p["same_order"]]
    quiet = [abs(r["error"]) for r in rows if r["foreign_share"] <= QUIET]
    lines = [
        f"{len(rows)} runs: median |error| {100 * med:.1f}% (target <= 20%: {'met' if med <= 0.2 else 'MISSED'}); "
        f"roofline median |error| {100 * roof:.1f}%",
        f"{len(quiet)} runs with other processes under {100 * QUIET:.0f}% of the machine: median |error| "
        + (f"{100 * statistics.median(quiet):.1f}%" if quiet else "-"),
        "worst: "
        + "; ".join(
            f"{r['model']}/{r['strategy']}/{r['seq_len']}/{r['remat']} {100 * r['error']:+.1f}%" for r in worst
        ),
        f"ranking: {len(pairs) - len(bad)} of {len(pairs)} pairs measured > {100 * RANK_GAP:.0f}% apart ordered "
        f"as measured ({'met' if not bad else 'MISSED'})",
    ]
    for p in pairs:
        lines.append(
            f"  {p['group']}: {p['faster']} < {p['slower']} measured x{p['measured_ratio']:.2f}, "
            f"predicted x{p['predicted_ratio']:.2f} {'ok' if p['same_order'] else 'WRONG ORDER'}"
        )
    return lines


def markdown(rows: list[dict]) -> str:
    """The CSV as a Markdown table (docs/time_model_cpu.md quotes it)."""
    head = "| model | strategy | seq_len | remat | measured s | predicted s | error | roofline s | others' share |"
    lines = [head, "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['strategy']} | {r['seq_len']:,} | {r['remat']} | {r['measured_s']:.2f} | "
            f"{r['predicted_s']:.2f} | {100 * r['error']:+.1f}% | {r['roofline_s']:.2f} | "
            f"{100 * r['foreign_share']:.0f}% |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: pathlib.Path, note: str) -> None:
    plt = C.pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.4))
    markers = dict(zip(STRATEGIES, "osD^"))
    for r in rows:
        color = "C0" if r["model"] == "tiny" else "C1"
        face = color if r["remat"] == "none" else "none"
        m = markers[r["strategy"]]
        ax1.scatter(r["measured_s"], r["predicted_s"], marker=m, edgecolors=color, facecolors=face)
        ax1.scatter(r["measured_s"], r["roofline_s"], marker=m, color="0.7", s=12)
    lo = min(min(r["measured_s"], r["roofline_s"]) for r in rows) * 0.8
    hi = max(max(r["measured_s"], r["predicted_s"]) for r in rows) * 1.2
    ax1.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    for f in (0.8, 1.2):
        ax1.plot([lo, hi], [f * lo, f * hi], "k:", lw=0.6)
    ax1.set(xscale="log", yscale="log", xlabel="measured step (s)", ylabel="predicted step (s)")
    ax1.set_title("calibrated (colour: tiny / small; hollow: remat full), roofline grey", fontsize=9)
    labels = [f"{r['model'][0]}-{r['strategy'][:2]}-{r['seq_len'] // 1024}k-{r['remat'][0]}" for r in rows]
    ax2.bar(
        range(len(rows)), [100 * r["error"] for r in rows], color=["C0" if r["model"] == "tiny" else "C1" for r in rows]
    )
    ax2.axhline(20, color="k", ls=":", lw=0.6)
    ax2.axhline(-20, color="k", ls=":", lw=0.6)
    ax2.set_xticks(range(len(rows)), labels, rotation=90, fontsize=6)
    ax2.set(ylabel="predicted / measured - 1 (%)", title="error per run")
    fig.suptitle(f"lcx step time on 8 simulated CPU devices: probed time model vs lcx.train ({note})", fontsize=9)
    C.save_figure(fig, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=pathlib.Path, help="gather existing runs in this directory (no training)")
    ap.add_argument("--launch", action="store_true", help="with --runs DIR: train the missing grid points there first")
    ap.add_argument(
        "--rerun-above",
        type=float,
        help="with --runs DIR --launch: train again the runs during which other processes used more than "
        "this share of the machine (load.json)",
    )
    ap.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    args = ap.parse_args(argv)
    sweep = args.runs or C.new_sweep_dir(NAME)
    if args.runs is None or args.launch:
        launch(sweep, args.rerun_above)
    rows = gather(sweep)
    if not rows:
        print(f"no runs under {sweep}", file=sys.stderr)
        return 1
    C.write_csv(rows, C.RESULTS / f"{NAME}.csv")
    plot(rows, C.RESULTS / f"{NAME}.png", C.machine_note({"packages": {"jax": rows[0]["jax"]}}))
    for line in check(rows):
        print(line)
    if args.markdown:
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
