"""One sliding-window layer under halo, ring and all-gather: bytes moved and fwd+bwd time.

Issue 40's benchmark: W = 1,024, S = 32,768 tokens, P = 8 simulated CPU devices (one context
axis), zigzag layout, causal sliding-window mask on one document, B = 1, 4 query heads and 1 kv
head of 64, float32, xla kernel with 512-token blocks. The three strategies run the SAME mask
(ring and all-gather with the window too; their kernels skip hidden tiles) in one process:

- bytes each device sends per fwd+bwd, two ways: from the compiled (optimised) HLO -- every
  collective-permute, all-gather, reduce-scatter, all-reduce and all-to-all, its operand bytes
  times the trip count of the while loops around it (:func:`hlo_collective_bytes`) -- and from
  the cost ledger (each strategy's ``traffic``, ``layers=1, replay=0``);
- fwd+bwd wall time: ``--repeats`` rounds after a warm-up, the three strategies interleaved in
  each round (so drift hits all alike), the median per strategy and its ratio to halo's.

The 8 simulated devices share the machine's cores: time measures total work plus collective
overhead, not parallel speed. Writes ``experiments/results/bench_halo.csv`` (the git commit,
python and jax versions, never a local path); ``python experiments/report.py`` renders it into
docs/strategies.md.

    python experiments/bench_halo.py                 # ~3-6 minutes on 2 cores
    python experiments/bench_halo.py --seq 8192 --repeats 2   # quick
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import re
import statistics
import sys
import time
from collections import defaultdict

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

from lcx.attention import Mask, attention  # noqa: E402
from lcx.attention.strategies import AttentionShard, get_strategy  # noqa: E402
from lcx.sharding import AttentionConfig, Plan, apply_layout, bind  # noqa: E402
from lcx.training.runinfo import git_commit  # noqa: E402

B, N, K, H = 1, 4, 1, 64
STRATEGIES = ("halo", "ring", "allgather")
_DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1, "f64": 8, "s64": 8}
_COLLECTIVES = ("collective-permute", "all-gather", "reduce-scatter", "all-reduce", "all-to-all")
_SHAPE = re.compile(r"\b(f32|bf16|f16|s32|u32|s8|u8|pred|f64|s64)\[([\d,]*)\]")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s+([\w\-]+)\((.*)$")


def _bytes(type_text: str) -> int:
    total = 0
    for dt, dims in _SHAPE.findall(type_text):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * _DTYPE_BYTES[dt]
    return total


def hlo_collective_bytes(hlo: str, degree: int) -> dict[str, float]:
    """Bytes one device sends, per collective kind, in an optimised SPMD HLO module's text.

    Each collective's result type gives its bytes (``-start`` variants counted, ``-done`` not); a
    device sends a collective-permute's whole operand, ``(P - 1) / P`` of an all-gather's result
    or of a reduce-scatter's operand (``P - 1`` results), ``2 (P - 1) / P`` of an all-reduce's and ``(P - 1) / P`` of
    an all-to-all's (ring algorithms). A computation called by a ``while`` counts
    ``known_trip_count`` times (XLA's backend config; 1 if absent), by any other op once.
    """
    comps: dict[str, list[str]] = {}
    entry, name = None, None
    for line in hlo.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):  # a computation's header
            words = line.split()
            is_entry = words[0] == "ENTRY"
            name = words[1 if is_entry else 0].lstrip("%")
            comps[name] = []
            entry = name if is_entry else entry
        elif name is not None:
            comps[name].append(line)
    frac = (degree - 1) / degree

    def own(lines):
        out, calls = defaultdict(float), []
        for line in lines:
            m = _INSTR.match(line)
            if not m:
                continue
            rtype, op = m.group(1), m.group(2)
            kind = op.removesuffix("-start")
            if kind in _COLLECTIVES and not op.endswith("-done"):
                b = _bytes(rtype)
                if kind == "collective-permute" and op.endswith("-start"):
                    b //= 2  # (operand, result) tuple
                out[kind] += b * {"collective-permute": 1, "all-reduce": 2 * frac, "reduce-scatter": degree - 1}.get(
                    kind, frac
                )
            trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
            for callee in re.findall(
                r"(?:body|to_apply|calls|branch_computations|true_computation|false_computation)=\{?%?([\w.\-]+)", line
            ):
                calls.append((callee, int(trips.group(1)) if (op == "while" and trips) else 1))
            for callee in re.findall(r"branch_computations=\{([^}]*)\}", line):
                calls += [(c.strip().lstrip("%"), 1) for c in callee.split(",")]
        return out, calls

    memo: dict[str, dict[str, float]] = {}

    def total(c):
        if c not in memo:
            out, calls = own(comps.get(c, []))
            memo[c] = dict(out)
            for callee, n in calls:
                for k, v in total(callee).items():
                    memo[c][k] = memo[c].get(k, 0.0) + n * v
        return memo[c]

    return total(entry) if entry else {}


def mesh_plan(strategy: str, P: int, block: int):
    plan = Plan(
        mesh=(("context", P),),
        activations={"seq": "context"},
        attention=AttentionConfig(strategy=strategy, layout="zigzag", block_q=block, block_kv=block),
    )
    return bind(plan, jax.devices()[:P])


def ledger_bytes(strategy: str, S: int, P: int, W: int, block: int) -> float:
    s = AttentionShard(B, S, P, 1, N, K, H, 4, window=W, documents=False, layout="zigzag", layout_block=block)
    t = get_strategy(strategy).traffic(s, layers=1, replay=0)
    return t.all_gather + t.all_to_all + t.ring


def build(strategy: str, S: int, P: int, W: int, block: int):
    """The compiled fwd+bwd of one layer and its concrete zigzag inputs."""
    mp = mesh_plan(strategy, P, block)
    mask = Mask(window=W)
    qs = mp.activation_sharding(("batch", "seq", "heads", "head_dim"))
    ps = mp.activation_sharding(("batch", "seq"))

    def fwd_bwd(q, k, v, pos, seg, do):
        f = lambda q, k, v: attention(q, k, v, plan=mp, mask=mask, positions=pos, segment_ids=seg)
        out, vjp = jax.vjp(f, q, k, v)
        return out, vjp(do)

    ks = jax.random.split(jax.random.key(0), 4)
    q = jax.device_put(jax.random.normal(ks[0], (B, S, N, H), jnp.float32), qs)
    k = jax.device_put(jax.random.normal(ks[1], (B, S, K, H), jnp.float32), qs)
    v = jax.device_put(jax.random.normal(ks[2], (B, S, K, H), jnp.float32), qs)
    do = jax.device_put(jax.random.normal(ks[3], (B, S, N, H), jnp.float32), qs)
    pos = jax.device_put(
        apply_layout(jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S)), "zigzag", P, axis=1), ps
    )
    seg = jax.device_put(jnp.zeros((B, S), jnp.int32), ps)
    args = (q, k, v, pos, seg, do)
    t0 = time.perf_counter()
    compiled = jax.jit(fwd_bwd).lower(*args).compile()
    return compiled, args, time.perf_counter() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="One sliding-window layer under halo, ring and all-gather.")
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--csv", default=str(C.RESULTS / "bench_halo.csv"))
    a = ap.parse_args(argv)
    S, P, W = a.seq, a.devices, a.window
    commit = git_commit() or "unrecorded"  # the tree that runs, before anything else can change it
    built = {}
    for s in STRATEGIES:
        compiled, args, compile_s = build(s, S, P, W, a.block)
        jax.block_until_ready(compiled(*args))  # warm-up
        built[s] = (compiled, args, compile_s)
        print(f"{s}: compiled in {compile_s:.1f} s", flush=True)
    times = defaultdict(list)
    for _ in range(a.repeats):  # interleaved rounds
        for s in STRATEGIES:
            compiled, args, _ = built[s]
            t = time.perf_counter()
            jax.block_until_ready(compiled(*args))
            times[s].append(time.perf_counter() - t)
    rows = []
    med = {s: statistics.median(times[s]) for s in STRATEGIES}
    hlo = {s: hlo_collective_bytes(built[s][0].as_text(), P) for s in STRATEGIES}
    hlo_total = {s: sum(hlo[s].values()) for s in STRATEGIES}
    for s in STRATEGIES:
        ledger = ledger_bytes(s, S, P, W, a.block)
        rows.append(
            {
                "strategy": s,
                "seq_len": S,
                "window": W,
                "devices": P,
                "batch": B,
                "heads": N,
                "kv_heads": K,
                "head_dim": H,
                "dtype": "float32",
                "layout": "zigzag",
                "kernel": "xla",
                "block": a.block,
                "hlo_bytes_per_device": int(hlo_total[s]),
                "hlo_collectives": ";".join(f"{k}={int(v)}" for k, v in sorted(hlo[s].items())),
                "ledger_bytes_per_device": int(ledger),
                "hlo_bytes_over_halo": hlo_total[s] / hlo_total["halo"],
                "fwd_bwd_s": med[s],
                "fwd_bwd_s_all": ";".join(f"{t:.4f}" for t in times[s]),
                "time_over_halo": med[s] / med["halo"],
                "compile_s": built[s][2],
                "repeats": a.repeats,
                "git_commit": commit[:12] + ("+dirty" if commit.endswith("+dirty") else ""),
                "python": platform.python_version(),
                "jax": jax.__version__,
                "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores",
            }
        )
        print(
            f"{s:>9}: HLO {hlo_total[s] / 2**20:8.2f} MiB sent/device, ledger {ledger / 2**20:8.2f} MiB, "
            f"fwd+bwd {med[s]:.3f} s (x{med[s] / med['halo']:.2f} halo)",
            flush=True,
        )
    C.write_csv(rows, C.out_file(pathlib.Path(a.csv), ".csv"))


if __name__ == "__main__":
    main()
