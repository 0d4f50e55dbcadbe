"""Ledger vs XLA: per-device memory predicted by lcx.cost against the compiled train step.

For a tiny Llama on 8 simulated CPU devices, every strategy (allgather, a2a, ring, usp) is
compiled with lcx.training's real train step (``jit(...).lower(...).compile()``, nothing runs)
at each sequence length and remat policy, and its ``memory_analysis()`` per-device footprint
(arguments + outputs - aliased + temporaries) is compared with
``lcx.cost.memory_breakdown(...).total``. Plans use all 8 devices:

- allgather, ring: context 8 (batch 1);
- a2a: data 2 x context 4 (batch 2): Ulysses needs its degree to divide the 4 query heads;
- usp: ulysses 2 x ring 4 (batch 1).

Prints one row per (strategy, S, remat), writes ``experiments/results/ledger_vs_compiled.csv``
and exits non-zero if any row differs by more than the tolerance (15%).

    python experiments/ledger_vs_compiled.py                      # all rows, ~3 min
    python experiments/ledger_vs_compiled.py --seq-len 4096 --remat full --strategy ring
    XLA_FLAGS="--xla_dump_to=/tmp/d --xla_dump_hlo_pass_re=NONE --xla_dump_hlo_module_re=jit_train" \
        python experiments/ledger_vs_compiled.py ...            # XLA's buffer assignment per row
"""

from __future__ import annotations

import argparse
import csv
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import equinox as eqx  # noqa: E402
import numpy as np  # noqa: E402

from lcx import cost  # noqa: E402
from lcx.models import init_model, model_shardings  # noqa: E402
from lcx.models.config import preset  # noqa: E402
from lcx.sharding import bind  # noqa: E402
from lcx.sharding.config import preset as plan_preset  # noqa: E402
from lcx.training.optim import make_optimizer  # noqa: E402
from lcx.training.step import BATCH_KEYS, make_steps  # noqa: E402

CSV = ROOT / "experiments" / "results" / "ledger_vs_compiled.csv"
MiB = 2**20

# (plan, global batch) per strategy, each on all 8 devices
PLANS = {
    "allgather": (lambda: plan_preset("allgather").with_mesh(data=1, context=8), 1),
    "a2a": (lambda: plan_preset("a2a").with_mesh(data=2, context=4), 2),
    "ring": (lambda: plan_preset("ring").with_mesh(data=1, context=8), 1),
    "usp": (lambda: plan_preset("usp").with_mesh(data=1, ulysses=2, ring=4), 1),
}


def compiled_bytes(cfg, plan, seq_len: int, batch: int, n_devices: int = 8):
    """``(bytes per device, memory_analysis)`` of lcx.training's train step, compiled only."""
    devices = jax.devices()[:n_devices]
    plan.validate(n_devices, dims=cfg.dims(), seq_len=seq_len, global_batch=batch)
    mp = bind(plan, devices)
    abstract = eqx.filter_eval_shape(init_model, cfg, key=jax.random.key(0))
    params = eqx.filter(abstract, lambda x: isinstance(x, jax.ShapeDtypeStruct))
    opt, _ = make_optimizer(lr=1e-3, steps=10, warmup_steps=1, min_lr_ratio=0.1, weight_decay=0.1, b1=0.9,
                            b2=0.95, grad_clip=1.0)
    steps = make_steps(abstract, opt, mp, model_shardings(abstract, mp))
    opt_state = jax.eval_shape(opt.init, params)
    b = {k: jax.ShapeDtypeStruct((batch, seq_len), np.float32 if k == "loss_mask" else np.int32) for k in BATCH_KEYS}
    m = steps.train.lower(params, opt_state, b).compile().memory_analysis()
    total = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
    return total, m


def compare(strategy: str, seq_len: int, remat: str, n_devices: int = 8) -> dict:
    """One row: the ledger's and XLA's per-device bytes for the tiny model."""
    make, batch = PLANS[strategy]
    plan = make()
    cfg = preset("tiny").replace(remat=remat)
    mem = cost.memory_breakdown(cfg, plan, n_devices, seq_len=seq_len, global_batch=batch,
                                policy=cost.ActivationPolicy.from_model(cfg), dtype=cfg.dtype,
                                param_dtype=cfg.param_dtype)
    t0 = time.perf_counter()
    got, m = compiled_bytes(cfg, plan, seq_len, batch, n_devices)
    return {
        "strategy": strategy, "seq_len": seq_len, "remat": remat, "global_batch": batch,
        "ledger_mib": mem.total / MiB, "compiled_mib": got / MiB, "temp_mib": m.temp_size_in_bytes / MiB,
        "ratio": mem.total / got, "compile_s": time.perf_counter() - t0,
        **{f"ledger_{k}_mib": v / MiB for k, v in mem.as_dict().items() if k not in ("total", "host")},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-len", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--remat", nargs="+", default=["full", "none"])
    ap.add_argument("--strategy", nargs="+", default=list(PLANS), choices=list(PLANS))
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument("--csv", default=str(CSV), help="where to write the rows ('' for nowhere)")
    args = ap.parse_args(argv)
    print("tiny Llama (float32), 8 CPU devices, xla kernel, blocks 512; MiB per device")
    print(f"{'strategy':10s} {'S':>6s} {'remat':6s} {'ledger':>8s} {'compiled':>9s} {'ratio':>6s}")
    rows = []
    for remat in args.remat:
        for S in args.seq_len:
            for name in args.strategy:
                r = compare(name, S, remat)
                rows.append(r)
                flag = "" if abs(r["ratio"] - 1) <= args.tolerance else "  <-- outside"
                print(f"{name:10s} {S:6d} {remat:6s} {r['ledger_mib']:8.2f} {r['compiled_mib']:9.2f} "
                      f"{r['ratio']:6.2f}{flag}", flush=True)
    if args.csv:
        path = pathlib.Path(args.csv)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            for r in rows:
                w.writerow({k: f"{v:.4f}" if isinstance(v, float) else v for k, v in r.items()})
        print(f"wrote {path}")
    worst = max(abs(r["ratio"] - 1) for r in rows)
    ok = worst <= args.tolerance
    print(f"worst relative difference {100 * worst:.1f}% ({'within' if ok else 'OUTSIDE'} {100 * args.tolerance:.0f}%)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
