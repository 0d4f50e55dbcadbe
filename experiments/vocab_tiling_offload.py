"""Vocabulary tiling and state host offload: the ledger against the compiled lcx train step.

For ``experiment=longctx_replica_cpu`` (ring over 8 simulated CPU devices, zigzag, ZeRO-3
parameters, remat custom with the block input and attention context offloaded, V = 128,256,
32,768 tokens) with ``memory.vocab_tiling`` N in {1, 4, 16} and ``memory.offload_optimizer`` +
``memory.offload_params`` off / on, lcx.training's real train step is lowered and compiled
(``make_steps(...).train.lower(...).compile()``) and NEVER run (the untiled step needs ~9 GiB
per device, ~70 GiB for the 8). Per row it prints:

- compiled device bytes per device: ``memory_analysis()``'s arguments + outputs - aliased +
  temporaries (experiments/ledger_vs_compiled.py's footprint) less the host-resident part;
- compiled host bytes per device: the parameters and outputs XLA places in host memory, marked
  ``S(5)`` in the compiled module's ``entry_computation_layout`` (e.g. ``f32[4,128256]{1,0:S(5)}``;
  ``memory_analysis()`` counts them in ``argument_size_in_bytes``, its ``host_*`` fields stay 0),
  less the outputs that alias them (donation);
- the ledger's device (``memory_breakdown(...).total``) and host (``.host``) bytes for the
  program XLA:CPU compiles (``memory_kinds=False``: its ``strip-memory-placement-annotations``
  pass removes every placement, so the step reads the pinned_host arguments in place and the
  activations the remat policy offloads stay temporaries), and their ratios; and, for
  reference, the ledger for a compiler that honours memory kinds (TPU, GPU: the step's device
  copies of the offloaded parameters and of the optimizer state for the update);
- the largest buffer of the compiled module with a V-sized dimension: ``b T / N x V`` float32
  elements when N > 1 (a tile of logits), ``b T x V`` untiled.

Writes ``experiments/results/vocab_tiling_offload.csv`` and ``.png`` (the default run only: other
``--tiles`` or Hydra overrides write to an explicit ``--out``) and exits 1 if a ratio is off by
more than the tolerance (15%) or a largest V-sized buffer is not the expected tile.

    python experiments/vocab_tiling_offload.py                  # 6 compiles, ~3 min on 2 cores
    python experiments/vocab_tiling_offload.py --tiles 1 4 --out /tmp/small \\
        model.vocab_size=4096 train.seq_len=2048                # any Hydra override of the replica
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import re
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import _common as C  # noqa: E402

NAME = "vocab_tiling_offload"
EXPERIMENT = "longctx_replica_cpu"
MiB = 2**20

_ITEMSIZE = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "bf16": 2,
    "f16": 2,
    "s16": 2,
    "u16": 2,
    "f32": 4,
    "s32": 4,
    "u32": 4,
    "f64": 8,
    "s64": 8,
    "u64": 8,
}
_SHAPE = re.compile(r"\b(pred|[su](?:8|16|32|64)|bf16|f(?:16|32|64))\[([\d,]*)\](?:\{([^}]*)\})?")


def _shapes(text: str) -> list[tuple[int, bool]]:
    """``(bytes, host-resident)`` of each array shape in a layout string, in order."""
    out = []
    for m in _SHAPE.finditer(text):
        dtype, dims, layout = m.groups()
        n = math.prod(int(d) for d in dims.split(",") if d)
        out.append((_ITEMSIZE[dtype] * n, "S(5)" in (layout or "")))
    return out


def host_bytes(hlo_text: str) -> dict[str, int]:
    """Bytes of the compiled module's host-resident (``S(5)``) parameters and outputs.

    Reads the module header: ``entry_computation_layout={(params...)->(outputs...)}`` gives each
    parameter's and output's per-device shape and layout (memory space 5 = host), and
    ``input_output_alias={ {out}: (param, {}, ...), ... }`` which outputs reuse which
    parameter's buffer (donation).

    Returns:
      ``{"args": host parameter bytes, "outputs": host output bytes, "aliased": host output
      bytes that alias a host parameter, "host": args + outputs - aliased}``.

    Raises:
      ValueError: no entry computation layout in the text.
    """
    head = hlo_text.split("\n", 1)[0]
    m = re.search(r"entry_computation_layout=\{\((.*)\)->\((.*)\)\}", head)
    if m is None:
        raise ValueError("no entry_computation_layout in the module header")
    params, outs = _shapes(m.group(1)), _shapes(m.group(2))
    alias = [(int(o), int(p)) for o, p in re.findall(r"\{(\d+)\}: \((\d+), \{\}", head)]
    args = sum(b for b, h in params if h)
    outputs = sum(b for b, h in outs if h)
    aliased = sum(outs[o][0] for o, p in alias if outs[o][1] and params[p][1])
    return {"args": args, "outputs": outputs, "aliased": aliased, "host": args + outputs - aliased}


def largest_vocab_buffer(hlo_text: str, vocab: int) -> tuple[int, str]:
    """``(elements, shape)`` of the largest array any instruction of the compiled module defines
    with a dimension of ``vocab``."""
    best = (0, "")
    for m in re.finditer(r"= (\w+)\[([\d,]+)\]", hlo_text):
        dims = [int(d) for d in m.group(2).split(",")]
        if vocab in dims and (n := math.prod(dims)) > best[0]:
            best = (n, f"{m.group(1)}[{m.group(2)}]")
    return best


def lower_train(cfg, devices=None):
    """lcx.training's train step for a composed ``lcx.train`` config, lowered with abstract
    inputs (nothing runs). Returns ``(lowered, model config, plan, MemoryOptions)``."""
    import equinox as eqx
    import numpy as np

    from lcx.config import run_config
    from lcx.models import init_model, model_shardings
    from lcx.sharding import bind
    from lcx.training.memory import check_tiling
    from lcx.training.optim import optimizer_from_config
    from lcx.training.step import BATCH_KEYS, make_steps

    devices = list(jax.devices() if devices is None else devices)
    config = run_config(cfg)
    S, B, plan, model_cfg, mem = (
        config.train.seq_len,
        config.train.global_batch,
        config.plan,
        config.model,
        config.memory,
    )
    plan.validate(len(devices), dims=model_cfg.dims(), seq_len=S, global_batch=B)
    check_tiling(mem, S // plan.context_degree(len(devices)))
    mp = bind(plan, devices)
    abstract = eqx.filter_eval_shape(init_model, model_cfg, key=jax.random.key(0))
    params = eqx.filter(abstract, lambda x: isinstance(x, jax.ShapeDtypeStruct))
    opt, _ = optimizer_from_config(config.train)
    steps = make_steps(abstract, opt, mp, model_shardings(abstract, mp), mem)
    opt_state = jax.eval_shape(opt.init, params)
    batch = {k: jax.ShapeDtypeStruct((B, S), np.float32 if k == "loss_mask" else np.int32) for k in BATCH_KEYS}
    with jax.numpy_dtype_promotion("standard"):  # optax's Adam: float ** int32 step
        lowered = steps.train.lower(params, opt_state, batch)
    return lowered, model_cfg, plan, mem


def compare(tiles: int, offload: bool, overrides=(), n_devices: int = 8) -> dict:
    """One row: the compiled step's device and host bytes per device and the ledger's."""
    from lcx import cost

    flag = str(offload).lower()
    cfg = C.compose(
        EXPERIMENT,
        [
            *overrides,
            f"memory.vocab_tiling={tiles}",
            f"memory.offload_optimizer={flag}",
            f"memory.offload_params={flag}",
        ],
    )
    t0 = time.perf_counter()
    lowered, mc, plan, mem = lower_train(cfg, jax.devices()[:n_devices])
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t0
    m = compiled.memory_analysis()
    text = compiled.as_text()
    host = host_bytes(text)
    footprint = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
    device = footprint - host["host"]
    S, B = int(cfg.train.seq_len), int(cfg.train.global_batch)
    policy = cost.ActivationPolicy.from_model(
        mc, vocab_tiling=mem.vocab_tiling, offload_optimizer=mem.offload_optimizer, offload_params=mem.offload_params
    )
    kw = dict(
        seq_len=S,
        global_batch=B,
        policy=policy,
        dtype=mc.dtype,
        param_dtype=mc.param_dtype,
        tie_embeddings=mc.tie_embeddings,
    )
    led = cost.memory_breakdown(mc, plan, n_devices, memory_kinds=False, **kw)
    acc = cost.memory_breakdown(mc, plan, n_devices, memory_kinds=True, **kw)
    P = plan.context_degree(n_devices)
    data = math.prod(plan.mesh_shape(n_devices)[a] for a in plan.batch_axes)
    tile = max(1, B // data) * (S // P) // tiles
    big, big_shape = largest_vocab_buffer(text, mc.vocab_size)
    return {
        "vocab_tiling": tiles,
        "offload": offload,
        "seq_len": S,
        "vocab": mc.vocab_size,
        "compiled_device_mib": device / MiB,
        "ledger_device_mib": led.total / MiB,
        "ratio_device": led.total / device,
        "compiled_host_bytes": host["host"],
        "ledger_host_bytes": led.host,
        "compiled_host_mib": host["host"] / MiB,
        "ledger_host_mib": led.host / MiB,
        "ratio_host": led.host / host["host"] if host["host"] else (1.0 if led.host == 0 else math.inf),
        "temp_mib": m.temp_size_in_bytes / MiB,
        "ledger_logits_mib": led.logits / MiB,
        "accel_device_mib": acc.total / MiB,
        "accel_host_mib": acc.host / MiB,
        "accel_transfer_mib": cost.host_transfer_bytes(acc, policy) / MiB,
        "largest_v_elements": big,
        "largest_v_shape": big_shape,
        "tile_v_elements": tile * mc.vocab_size,
        "compile_s": compile_s,
    }


def plot(rows, path: pathlib.Path) -> pathlib.Path:
    plt = C.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    labels = [f"N={r['vocab_tiling']}\n{'offload' if r['offload'] else 'on device'}" for r in rows]
    xs = range(len(rows))
    for ax, key, title in ((a, "device", "device bytes per device"), (b, "host", "host bytes per device")):
        ax.bar([x - 0.2 for x in xs], [r[f"compiled_{key}_mib"] for r in rows], 0.4, label="compiled (XLA:CPU)")
        ax.bar([x + 0.2 for x in xs], [r[f"ledger_{key}_mib"] for r in rows], 0.4, label="ledger")
        for x, r in zip(xs, rows):
            if r[f"compiled_{key}_mib"] > 0:
                ax.text(
                    x + 0.2, r[f"ledger_{key}_mib"], f"{r[f'ratio_{key}']:.3f}", ha="center", va="bottom", fontsize=8
                )
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.set_ylabel("MiB")
        ax.set_title(title)
        ax.legend(fontsize=8)
    a.set_yscale("log")
    fig.suptitle(
        f"{EXPERIMENT}: vocabulary tiling N x optimizer+parameter offload "
        f"(S={rows[0]['seq_len']:,}, V={rows[0]['vocab']:,}; label: ledger / compiled)"
    )
    return C.save_figure(fig, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiles", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument(
        "--out",
        type=pathlib.Path,
        default=None,
        help=f"CSV/PNG path without suffix; default {C.rel(C.RESULTS / NAME)} for the full default run, "
        "nowhere for a partial one",
    )
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of experiment=longctx_replica_cpu")
    a = ap.parse_args(argv)
    partial = a.tiles != ap.get_default("tiles") or bool(a.overrides)
    out = a.out if a.out is not None else (None if partial else C.RESULTS / NAME)
    if out is None:
        print(f"partial run: no CSV written, the committed {C.rel(C.RESULTS / NAME)}.csv stays; --out PATH writes one")
    print(f"experiment={EXPERIMENT} {' '.join(a.overrides)}: 8 CPU devices, compiled only; MiB per device")
    print(
        f"{'N':>3s} {'offload':7s} {'compiled dev':>12s} {'ledger dev':>10s} {'ratio':>6s} {'compiled host':>13s} "
        f"{'ledger host':>11s} {'ratio':>6s} {'accel dev':>9s} {'accel host':>10s} {'largest V buffer':>22s}"
    )
    rows, bad = [], []
    for n in a.tiles:
        for off in (False, True):
            r = compare(n, off, a.overrides)
            rows.append(r)
            ok_v = r["largest_v_elements"] == r["tile_v_elements"]
            ok = abs(r["ratio_device"] - 1) <= a.tolerance and abs(r["ratio_host"] - 1) <= a.tolerance and ok_v
            if not ok:
                bad.append(r)
            print(
                f"{n:3d} {str(off):7s} {r['compiled_device_mib']:12.2f} {r['ledger_device_mib']:10.2f} "
                f"{r['ratio_device']:6.3f} {r['compiled_host_mib']:13.3f} {r['ledger_host_mib']:11.3f} "
                f"{r['ratio_host']:6.3f} {r['accel_device_mib']:9.2f} {r['accel_host_mib']:10.3f} "
                f"{r['largest_v_shape']:>22s}"
                + ("" if ok_v else f" (expected {r['tile_v_elements']:,} elements)")
                + ("" if ok else "  <-- outside"),
                flush=True,
            )
    if out is not None:
        C.write_csv(rows, C.out_file(out, ".csv"))
        plot(rows, C.out_file(out, ".png"))
    worst = max(max(abs(r["ratio_device"] - 1), abs(r["ratio_host"] - 1)) for r in rows)
    print(
        f"worst relative difference {100 * worst:.1f}% "
        f"({'within' if worst <= a.tolerance else 'OUTSIDE'} {100 * a.tolerance:.0f}%)"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
