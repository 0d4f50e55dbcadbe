"""Context-parallel generation at long context: prefill time, decode tokens/s, KV-cache bytes.

Issue 42's benchmark: one prompt of ``--seq`` tokens (32,768 by default) through the ``tiny``
preset (2 global layers, 4 query heads on 1 kv head of 32, float32) and ``tiny_hybrid`` (6 layers:
two sliding-window layers of 512 tokens per global layer), both with Llama 3.1 RoPE scaling x 8
(the presets' unscaled range is 8K positions, which generation refuses to exceed), on P = 8 simulated CPU devices (ring
for global layers, halo for sliding ones, zigzag layout, xla kernel, 512-token blocks) and on one
device. Per (model, devices):

- prefill seconds: the compiled prefill (prompt -> KV cache and first logits), median of
  ``--repeats`` runs after a warm-up;
- decode tokens/s: the compiled generation loop (``--new`` greedy tokens per row, the prefill's
  state in), ``B (new - 1) / seconds``, median of ``--repeats``;
- KV-cache bytes per device, two ways: the ledger (:func:`lcx.cost.kv_cache_bytes_per_device` of
  the cache layout) and the compiled prefill's per-device output (``memory_analysis()`` of a
  program returning only the cache), and the ratio of each to one device's.

The 8 simulated devices share the machine's cores: times measure total work plus collective
overhead, not parallel speed-up. Writes ``experiments/results/bench_generate.csv`` (git commit,
python, jax; never a local path); ``python experiments/report.py`` renders it into
docs/generation.md.

    python experiments/bench_generate.py                      # ~5-10 minutes on 2 cores
    python experiments/bench_generate.py --seq 4096 --repeats 1   # quick
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import equinox as eqx  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

from lcx.generate import cache_bytes_per_device, cache_layout, prefill  # noqa: E402
from lcx.generate.cache import ring_sources  # noqa: E402
from lcx.generate.engine import _loop, _prefill  # noqa: E402
from lcx.generate.prompts import as_rows, prepare  # noqa: E402
from lcx.models import init_model, preset  # noqa: E402
from lcx.sharding import AttentionConfig, Plan, bind  # noqa: E402
from lcx.training.runinfo import git_commit  # noqa: E402

BLOCK = 512


def plans(devices: int):
    attention = AttentionConfig(
        strategy={"global": "ring", "sliding": "halo", "chunked": "halo"},
        layout="zigzag",
        block_q=BLOCK,
        block_kv=BLOCK,
    )
    if devices == 1:
        return bind(Plan(mesh=(("data", 1),), activations={"batch": "data"}, attention=attention), jax.devices()[:1])
    return bind(Plan(mesh=(("context", devices),), activations={"seq": "context"}, attention=attention))


def _median(fn, repeats: int) -> float:
    fn()  # warm-up (compiles)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def compiled_cache_bytes(model, prompt, mp, new: int) -> int:
    """Per-device output bytes of the compiled prefill, the cache alone (``memory_analysis``)."""
    batch = prepare(as_rows(prompt), mp, [model.layer_options(k).mask for k in model.config.layer_kinds])
    layout = cache_layout(
        model.config.layer_kinds, degree=mp.context_degree, prompt_len=batch.prompt_len, max_new_tokens=new
    )
    P = mp.context_degree
    rings = tuple(
        tuple(np.asarray(a) for a in ring_sources(batch.lengths, batch.inverse, g.local_slots * P, P))
        for g in layout.groups
        if g.is_ring
    )
    last = np.take_along_axis(batch.inverse, batch.lengths[:, None].astype(np.int64) - 1, axis=1)[:, 0]
    params, static = eqx.partition(model, eqx.is_array)

    def caches(params, *args):
        return _prefill(eqx.combine(params, static), *args, layout=layout, plan=mp)[0].caches

    args = (batch.tokens, batch.positions, batch.segment_ids, last, batch.lengths, rings)
    compiled = jax.jit(caches).lower(params, *args).compile()
    return int(compiled.memory_analysis().output_size_in_bytes)


def measure(name: str, devices: int, seq: int, new: int, repeats: int) -> dict:
    # Llama 3.1 RoPE scaling x 8: a 32K prompt is beyond the presets' unscaled 8K range, which
    # lcx.generate refuses; the scaling changes no cost
    cfg = dataclasses.replace(preset(name), rope_scaling_factor=8.0)
    model = init_model(cfg, key=jax.random.key(0))
    mp = plans(devices)
    prompt = [np.random.default_rng(0).integers(0, cfg.vocab_size, seq)]
    pre = prefill(model, prompt, plan=mp, max_new_tokens=new)
    prefill_s = _median(lambda: prefill(model, prompt, plan=mp, max_new_tokens=new).logits, repeats)

    def decode():
        return _loop(
            model, pre.state, pre.logits, jax.random.key(0),
            layout=pre.layout, plan=mp, n=new, temperature=0.0, top_p=1.0, eos=-1,
        )  # fmt: skip

    decode_s = _median(decode, repeats)
    ledger = cache_bytes_per_device(
        pre.layout, local_batch=1, kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, bytes_per_element=4
    )
    compiled = compiled_cache_bytes(model, prompt, mp, new)
    return {
        "model": name,
        "devices": devices,
        "seq_len": seq,
        "new_tokens": new,
        "layers": cfg.n_layers,
        "kinds": "+".join(sorted({k.kind for k in cfg.layer_kinds})),
        "prefill_s": f"{prefill_s:.3f}",
        "decode_tokens_per_s": f"{(new - 1) / decode_s:.2f}",
        "kv_ledger_bytes": ledger,
        "kv_compiled_bytes": compiled,
        "ledger_over_compiled": f"{ledger / compiled:.4f}",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=32768, help="prompt tokens")
    ap.add_argument("--new", type=int, default=32, help="tokens generated")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per measure (median)")
    ap.add_argument("--models", default="tiny,tiny_hybrid", help="comma-separated presets")
    args = ap.parse_args()
    rows = []
    for name in args.models.split(","):
        for devices in (8, 1):
            r = measure(name, devices, args.seq, args.new, args.repeats)
            print(r, file=sys.stderr)
            rows.append(r)
    for r in rows:  # ratios to one device's
        one = next(x for x in rows if x["model"] == r["model"] and x["devices"] == 1)
        r["kv_fraction_of_one_device"] = f"{r['kv_compiled_bytes'] / one['kv_compiled_bytes']:.4f}"
        r["prefill_over_one_device"] = f"{float(r['prefill_s']) / float(one['prefill_s']):.2f}"
        commit = git_commit() or "unrecorded"
        r |= {
            "repeats": args.repeats,
            "machine": C.machine_note(),
            "git_commit": commit[:12],
            "python": platform.python_version(),
            "jax": jax.__version__,
        }
    print(f"wrote {C.rel(C.write_csv(rows, C.RESULTS / 'bench_generate.csv'))}", file=sys.stderr)


if __name__ == "__main__":
    main()
