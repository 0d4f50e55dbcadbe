"""Experiment (c): per-device compiled memory of the train step vs context-parallel degree.

For each strategy, sequence length and degree P of ``experiment=memory_vs_degree``
(conf/experiment/memory_vs_degree.yaml), the training config ``experiment=memory_vs_degree
plan=<strategy> hardware.cpu_devices=P train.seq_len=S`` is composed, its plan bound to the
first P of 8 simulated CPU devices, and lcx's real train step (forward, backward, AdamW update)
compiled with abstract inputs -- nothing runs. ``memory_analysis()`` gives per-device bytes:
arguments (parameters, optimizer state, batch), temporaries, and the total live footprint
(arguments + outputs - aliased + temporaries). ``ledger_mib`` is lcx.cost.memory_breakdown's
prediction of the same total. A plan the validator refuses (e.g. Ulysses with more devices
than heads) is recorded with its message instead of numbers.

Two diagnostics per row, as in ``experiments/ledger_vs_compiled.py``: ``live_mib``, the total
with the temporaries replaced by the peak of bytes live at one instant in XLA's buffer assignment
(equal to ``total_mib`` when the heap has no packing loss), and ``memopt_mib``, the total compiled
with XLA:CPU's memory-optimised scheduler instead of its default concurrency-optimised one.

Writes ``experiments/results/memory_vs_degree.csv`` and ``.png`` (a run with Hydra overrides
selects other rows, so it writes them only to an explicit ``--out PATH``: a partial run never
replaces the committed results).

    python experiments/memory_vs_degree.py        # ~3-5 min (compilation only, three per row)
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _common as C  # noqa: E402

NAME = "memory_vs_degree"


def compiled_memory(cfg, devices, diagnostics: bool = False):
    """``(memory_analysis, ledger MemoryBreakdown, compile seconds, diagnostics)`` of cfg's train
    step; ``diagnostics`` (with ``diagnostics=True``, else empty): ``live`` and ``memopt``, bytes
    per device (see the module doc)."""
    import tempfile

    import equinox as eqx
    import jax
    import ledger_vs_compiled as lvc
    import numpy as np

    from lcx import cost
    from lcx.config import run_config
    from lcx.models import init_model, model_shardings
    from lcx.sharding import bind
    from lcx.training.optim import optimizer_from_config
    from lcx.training.step import BATCH_KEYS, make_steps

    config = run_config(cfg)
    model_cfg, plan = config.model, config.plan
    S, B = config.train.seq_len, config.train.global_batch
    plan.validate(len(devices), dims=model_cfg.dims(), seq_len=S, global_batch=B)
    mp = bind(plan, devices)
    abstract = eqx.filter_eval_shape(init_model, model_cfg, key=jax.random.key(0))
    params = eqx.filter(abstract, lambda x: isinstance(x, jax.ShapeDtypeStruct))
    opt, _ = optimizer_from_config(config.train)
    steps = make_steps(abstract, opt, mp, model_shardings(abstract, mp))
    opt_state = jax.eval_shape(opt.init, params)
    b = {k: jax.ShapeDtypeStruct((B, S), np.float32 if k == "loss_mask" else np.int32) for k in BATCH_KEYS}
    t0 = time.perf_counter()
    lowered = steps.train.lower(params, opt_state, b)
    diag = {}
    if diagnostics:
        with tempfile.TemporaryDirectory() as d, lvc.no_persistent_cache():
            m = lowered.compile(compiler_options=lvc.dump_options(d)).memory_analysis()
            alloc, live = lvc.live_temp_peak(d)
        assert alloc == m.temp_size_in_bytes, (alloc, m.temp_size_in_bytes)
        diag = {
            "live": lvc.footprint(m) - alloc + live,
            "memopt": lvc.footprint(lowered.compile(compiler_options=lvc.MEMOPT).memory_analysis()),
        }
    else:
        m = lowered.compile().memory_analysis()
    dt = time.perf_counter() - t0
    ledger = cost.memory_breakdown(
        model_cfg,
        plan,
        len(devices),
        seq_len=S,
        global_batch=B,
        policy=cost.ActivationPolicy.from_model(model_cfg),
        dtype=model_cfg.dtype,
        param_dtype=model_cfg.param_dtype,
        tie_embeddings=model_cfg.tie_embeddings,
    )
    return m, ledger, dt, diag


def run(overrides=()) -> list[dict]:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    base = C.compose(NAME, overrides)
    mv = base.memory_vs_degree
    rows = []
    for S in mv.seq_lens:
        for strategy in mv.strategies:
            for P in mv.degrees:
                cfg = C.compose(
                    NAME, [*overrides, f"plan={strategy}", f"hardware.cpu_devices={P}", f"train.seq_len={S}"]
                )
                row = {"strategy": strategy, "seq_len": int(S), "degree": int(P), "tokens_per_device": int(S) // int(P)}
                try:
                    m, ledger, dt, diag = compiled_memory(cfg, jax.devices()[: int(P)], diagnostics=True)
                except ValueError as e:  # PlanError is a ValueError: a refused plan is a result too
                    row.update(
                        args_mib="",
                        temp_mib="",
                        total_mib="",
                        ledger_mib="",
                        live_mib="",
                        memopt_mib="",
                        compile_s="",
                        refused=str(e).splitlines()[0][:200],
                    )
                    print(f"  {strategy:9s} S={S:6d} P={P}: refused ({row['refused'][:80]})", flush=True)
                else:
                    total = (
                        m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
                    )
                    row.update(
                        args_mib=m.argument_size_in_bytes / C.MIB,
                        temp_mib=m.temp_size_in_bytes / C.MIB,
                        total_mib=total / C.MIB,
                        ledger_mib=ledger.total / C.MIB,
                        live_mib=diag["live"] / C.MIB,
                        memopt_mib=diag["memopt"] / C.MIB,
                        compile_s=dt,
                        refused="",
                    )
                    print(
                        f"  {strategy:9s} S={S:6d} P={P}: temp {row['temp_mib']:8.1f} MiB, total {row['total_mib']:8.1f}"
                        f" MiB (live peak {row['live_mib']:8.1f}, memory-optimised schedule {row['memopt_mib']:8.1f}),"
                        f" ledger {row['ledger_mib']:8.1f} MiB",
                        flush=True,
                    )
                rows.append(row)
    return rows


def plot(rows, path: pathlib.Path, note: str = "") -> pathlib.Path:
    plt = C.pyplot()
    seqs = sorted({int(r["seq_len"]) for r in rows})
    fig, axes = plt.subplots(1, len(seqs), figsize=(max(8, 6 * len(seqs)), 4.8), squeeze=False)
    for ax, S in zip(axes[0], seqs):
        for strategy in dict.fromkeys(r["strategy"] for r in rows):
            rs = [
                r
                for r in rows
                if int(r["seq_len"]) == S and r["strategy"] == strategy and r["total_mib"] not in ("", None)
            ]
            if not rs:
                continue
            x = [int(r["degree"]) for r in rs]
            (line,) = ax.plot(x, [float(r["total_mib"]) for r in rs], "o-", label=f"{strategy} compiled")
            ax.plot(
                x,
                [float(r["ledger_mib"]) for r in rs],
                "x--",
                color=line.get_color(),
                alpha=0.6,
                label=f"{strategy} ledger",
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("context-parallel degree P")
        ax.set_ylabel("per-device memory of the train step (MiB)")
        ax.set_title(f"S = {S} tokens, batch 1")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"compiled per-device memory vs context degree, tiny Llama\n{note.strip(' ()')}", fontsize=10)
    return C.save_figure(fig, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out",
        type=pathlib.Path,
        default=None,
        help=f"CSV/PNG path without suffix; default: {C.RESULTS / NAME} for the full run, nowhere for a "
        "run with overrides",
    )
    ap.add_argument("--replot", action="store_true", help="only redraw the PNG from the existing CSV")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. 'memory_vs_degree.seq_lens=[4096]'")
    a = ap.parse_args(argv)
    if a.out is None and a.overrides and not a.replot:
        print(
            f"partial run (overrides {a.overrides}): no CSV or PNG written, the committed {C.RESULTS / NAME}.csv "
            "stays; --out PATH writes these rows"
        )
    out = a.out if a.out is not None or (a.overrides and not a.replot) else C.RESULTS / NAME
    if a.replot:
        rows = C.read_csv(C.out_file(out, ".csv"))
    else:
        rows = run(a.overrides)
        if out is None:
            return 0
        C.write_csv(rows, C.out_file(out, ".csv"))
    plot(rows, C.out_file(out, ".png"), f" ({C.machine_note()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
