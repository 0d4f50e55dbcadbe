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
(the full default run only: a run with any other ``--seq-len``/``--remat``/``--strategy`` or
``--no-diagnostics`` writes a CSV only to an explicit ``--csv PATH``, so a partial run never
replaces the committed rows) and exits non-zero if any row differs by more than the tolerance (15%).

Two diagnostics per row (``--no-diagnostics`` skips them, halving the time):

- ``live_peak_mib``: the same footprint with the temporaries replaced by the most bytes of XLA's
  temporary allocation that hold live values at one instant -- the union of the byte ranges of
  the values live at each point of XLA's schedule (its ``*-buffer-assignment.txt`` and
  ``*-live-range.txt``, dumped for that compile). ``live_peak_mib < compiled_mib`` would be
  XLA's heap packing (fragmentation); equal means every allocated byte is live at the peak.
  (The "peak" XLA prints at the end of its own live-range report is lower: it leaves out the
  while loops' phi values, e.g. the stacked residuals the layer scan carries into the backward.)
- ``memopt_mib``: the footprint compiled with XLA:CPU's memory-optimised scheduler
  (``xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED``; the CPU default is the
  concurrency-optimised one, which starts independent work early: copies of the next layer's
  residuals out of the scan's stacks, attention-backward buffers, all live during the MLP's
  backward). Compile option for that one compile only, never set globally.

    python experiments/ledger_vs_compiled.py                      # all rows, ~11 min
    python experiments/ledger_vs_compiled.py --seq-len 4096 --remat full --strategy ring
    XLA_FLAGS="--xla_dump_to=/tmp/d --xla_dump_hlo_pass_re=NONE --xla_dump_hlo_module_re=jit_train" \
        python experiments/ledger_vs_compiled.py ...            # XLA's buffer assignment per row
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import equinox as eqx  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental.compilation_cache import compilation_cache  # noqa: E402

from lcx import cost  # noqa: E402
from lcx.models import init_model, model_shardings  # noqa: E402
from lcx.models.presets import preset  # noqa: E402
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
    # a strategy per layer kind: ring for global layers, halo for windowed ones (model=tiny_hybrid;
    # zigzag over 2 x 4 devices keeps the 512-token window's 511-token halo within a 512-token chunk)
    "ring_halo": (lambda: plan_preset("ring_halo"), 2),
}
UNIFORM = ("allgather", "a2a", "ring", "usp")
"""The rows of the committed table (``--strategy`` default): the uniform tiny model's."""


MEMOPT = {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"}


def lower_train(cfg, plan, seq_len: int, batch: int, devices):
    """lcx.training's train step for ``cfg`` under ``plan`` on ``devices``, lowered with abstract
    inputs (nothing runs)."""
    plan.validate(len(devices), dims=cfg.dims(), seq_len=seq_len, global_batch=batch)
    mp = bind(plan, devices)
    abstract = eqx.filter_eval_shape(init_model, cfg, key=jax.random.key(0))
    params = eqx.filter(abstract, lambda x: isinstance(x, jax.ShapeDtypeStruct))
    opt, _ = make_optimizer(
        lr=1e-3, steps=10, warmup_steps=1, min_lr_ratio=0.1, weight_decay=0.1, b1=0.9, b2=0.95, grad_clip=1.0
    )
    steps = make_steps(abstract, opt, mp, model_shardings(abstract, mp))
    opt_state = jax.eval_shape(opt.init, params)
    b = {k: jax.ShapeDtypeStruct((batch, seq_len), np.float32 if k == "loss_mask" else np.int32) for k in BATCH_KEYS}
    return steps.train.lower(params, opt_state, b)


def footprint(m) -> int:
    """Per-device bytes of a ``memory_analysis()``: arguments + outputs - aliased + temporaries."""
    return m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes


def compiled_bytes(cfg, plan, seq_len: int, batch: int, n_devices: int = 8):
    """``(bytes per device, memory_analysis)`` of lcx.training's train step, compiled only."""
    m = lower_train(cfg, plan, seq_len, batch, jax.devices()[:n_devices]).compile().memory_analysis()
    return footprint(m), m


def live_temp_peak(dump_dir) -> tuple[int, int]:
    """``(temp allocation bytes, peak live bytes in it)`` from XLA:CPU's dump of one train step.

    Reads ``*train*cpu_after_optimizations-buffer-assignment.txt`` (every value of the
    preallocated temporary allocation with its offset and size) and ``-live-range.txt`` (each
    value's interval in the flattened schedule). At each instant the bytes held are the union of
    the byte ranges of the values live then (values that alias one buffer, such as a while
    loop's phi values, overlap and count once); the peak is the largest such union.

    Raises:
      FileNotFoundError: no dump of a train step in ``dump_dir``.
      ValueError: a value of the allocation has no live range (the dump format changed).
    """
    import re

    d = pathlib.Path(dump_dir)
    found = sorted(d.glob("*train*cpu_after_optimizations-buffer-assignment.txt"))
    if not found:
        raise FileNotFoundError(f"no train-step buffer assignment dumped in {d}")
    ba = found[-1]
    ranges, in_ranges = {}, False
    for line in ba.with_name(ba.name.replace("-buffer-assignment.txt", "-live-range.txt")).read_text().splitlines():
        s = line.strip()
        if s.startswith("BufferLiveRange"):
            in_ranges = True
        elif s.startswith("Live ranges at"):
            break
        elif in_ranges and (m := re.fullmatch(r"(\S+?\{[^}]*\}):(\d+)-(\d+)", s)):
            ranges[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    size, values, cur = 0, [], False
    for line in ba.read_text().splitlines():
        if line.startswith("allocation "):
            cur = "preallocated-temp" in line
            if cur:
                size = int(re.match(r"allocation \d+: size (\d+)", line).group(1))
        elif line.startswith("Total bytes used"):
            break
        elif cur and (
            m := re.match(r"\s*value: <\d+ (\S+?)(\{[^}]*\})?(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\)", line)
        ):
            name = m.group(1) + (m.group(2) or "{}")
            if name not in ranges:
                raise ValueError(f"{name} has no live range in the dump")
            values.append((*ranges[name], int(m.group(4)), int(m.group(4)) + int(m.group(3))))
    # sweep the schedule: at each instant, the union of the live values' byte ranges
    events = sorted({t for v in values for t in (v[0], v[1])})
    peak = 0
    for t in events:
        spans = sorted((a, b) for s0, s1, a, b in values if s0 <= t <= s1)
        held, end = 0, -1
        for a, b in spans:
            if b > end:
                held += b - max(a, end)
                end = b
        peak = max(peak, held)
    return size, peak


def compare(
    strategy: str, seq_len: int, remat: str, n_devices: int = 8, *, model: str = "tiny", diagnostics: bool = False
) -> dict:
    """One row: the ledger's and XLA's per-device bytes for the tiny model (``model``: another
    preset, e.g. ``tiny_hybrid``, whose layer kinds the ledger prices per kind; with
    ``diagnostics``, also XLA's live peak and the memory-optimised schedule's footprint: see the
    module doc)."""
    make, batch = PLANS[strategy]
    plan = make()
    cfg = preset(model).replace(remat=remat)
    mem = cost.memory_breakdown(
        cfg,
        plan,
        n_devices,
        seq_len=seq_len,
        global_batch=batch,
        policy=cost.ActivationPolicy.from_model(cfg),
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
    )
    t0 = time.perf_counter()
    lowered = lower_train(cfg, plan, seq_len, batch, jax.devices()[:n_devices])
    extra = {}
    if diagnostics:
        with tempfile.TemporaryDirectory() as d, no_persistent_cache():
            m = lowered.compile(compiler_options=dump_options(d)).memory_analysis()
            alloc, live = live_temp_peak(d)
        assert alloc == m.temp_size_in_bytes, (alloc, m.temp_size_in_bytes)
        live_total = footprint(m) - alloc + live
        memopt = footprint(lowered.compile(compiler_options=MEMOPT).memory_analysis())
        extra = {
            "live_peak_mib": live_total / MiB,
            "ratio_live": mem.total / live_total,
            "memopt_mib": memopt / MiB,
            "ratio_memopt": mem.total / memopt,
        }
    else:
        m = lowered.compile().memory_analysis()
    got = footprint(m)
    return {
        "strategy": strategy,
        "seq_len": seq_len,
        "remat": remat,
        "global_batch": batch,
        "ledger_mib": mem.total / MiB,
        "compiled_mib": got / MiB,
        "temp_mib": m.temp_size_in_bytes / MiB,
        "ratio": mem.total / got,
        **extra,
        "compile_s": time.perf_counter() - t0,
        **{f"ledger_{k}_mib": v / MiB for k, v in mem.as_dict().items() if k not in ("total", "host")},
    }


@contextlib.contextmanager
def no_persistent_cache():
    """Compile for real inside the block: XLA dumps only what it compiles, and a hit in JAX's
    persistent compilation cache (``JAX_COMPILATION_CACHE_DIR``; CI shares one per run) would
    dump nothing. The setting is restored on exit."""
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    compilation_cache.reset_cache()  # the cache is set up once per process: re-read the setting
    try:
        yield
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
        compilation_cache.reset_cache()


def dump_options(d) -> dict:
    """Compile options that dump XLA's buffer assignment and live ranges of the train step to ``d``."""
    return {"xla_dump_to": str(d), "xla_dump_hlo_as_text": True, "xla_dump_hlo_module_re": ".*train.*"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-len", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--remat", nargs="+", default=["full", "none", "dots_saveable", "dots_with_no_batch_dims_saveable"])
    ap.add_argument("--strategy", nargs="+", default=list(UNIFORM), choices=list(PLANS))
    ap.add_argument("--model", default="tiny", help="model preset (tiny_hybrid: with --strategy ring_halo)")
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument(
        "--csv",
        default=None,
        help=f"where to write the rows ('' for nowhere); default: {os.path.relpath(CSV, ROOT)} for the full "
        "default run, nowhere for a partial one",
    )
    ap.add_argument(
        "--no-diagnostics",
        dest="diagnostics",
        action="store_false",
        help="skip XLA's live peak and the memory-optimised schedule (one compile per row)",
    )
    args = ap.parse_args(argv)
    partial = [
        f"--{k.replace('_', '-')}"
        for k in ("seq_len", "remat", "strategy", "model", "diagnostics")
        if getattr(args, k) != ap.get_default(k)
    ]
    if args.csv is None:
        args.csv = "" if partial else str(CSV)
        if partial:
            print(
                f"partial run ({', '.join(partial)} not the defaults): no CSV written, the committed "
                f"{os.path.relpath(CSV, ROOT)} stays; --csv PATH writes these rows"
            )
    print("tiny Llama (float32), 8 CPU devices, xla kernel, blocks 512; MiB per device")
    print(
        f"{'strategy':10s} {'S':>6s} {'remat':6s} {'ledger':>8s} {'compiled':>9s} {'ratio':>6s}"
        + (f" {'live peak':>9s} {'ratio':>6s} {'memopt':>8s} {'ratio':>6s}" if args.diagnostics else "")
    )
    rows = []
    for remat in args.remat:
        for S in args.seq_len:
            for name in args.strategy:
                r = compare(name, S, remat, model=args.model, diagnostics=args.diagnostics)
                rows.append(r)
                flag = "" if abs(r["ratio"] - 1) <= args.tolerance else "  <-- outside"
                print(
                    f"{name:10s} {S:6d} {remat:6s} {r['ledger_mib']:8.2f} {r['compiled_mib']:9.2f} "
                    f"{r['ratio']:6.2f}"
                    + (
                        f" {r['live_peak_mib']:9.2f} {r['ratio_live']:6.2f} {r['memopt_mib']:8.2f} "
                        f"{r['ratio_memopt']:6.2f}"
                        if args.diagnostics
                        else ""
                    )
                    + flag,
                    flush=True,
                )
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
