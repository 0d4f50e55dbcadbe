"""lcx's context-parallel attention on the two supported stacks, alternated in one run.

The README's two stacks (Python 3.11 + jax 0.10.2, Python 3.12 + jax 0.12) are timed by running
this script's worker under each interpreter in turn, A B A B (``--rounds`` times each), so load
on the machine drifts over both stacks alike. Each worker measures, on 8 simulated CPU devices,
B=1, 8 query heads, head_dim 64, float32, causal, zigzag layout, xla kernel, for every lcx
strategy (ring, usp 2x4, allgather, a2a) and every S in ``--seqs`` (default 4096; each doubling
of S costs ~4x, so 16384 takes ~15 minutes per worker on 2 cores):

- forward and forward+backward wall time: median of ``--repeats`` runs after a warm-up
  (:func:`bench_attention.timed`), compile time apart;
- per-device temporary memory of the compiled forward and forward+backward
  (``memory_analysis().temp_size_in_bytes``).

A row's time on a stack is the median over that stack's rounds; the ratio column is current /
floor (below 1: the current stack is faster). Correctness is the test suite's job (both stacks
run it in CI); this only times the same programs on both.

    python experiments/bench_stacks.py --python .venv/bin/python .venv312/bin/python  # ~6 min
    python experiments/bench_stacks.py --python A B --seqs 4096 --repeats 3 --rounds 1  # quick

Writes ``experiments/results/stack_benchmark.csv`` (one row per stack, strategy, S and round);
``python experiments/report.py`` renders it into docs/stack_benchmark.md. Run it on an idle
machine (``uptime``): the 8 simulated devices share the machine's cores.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
STRATEGIES = ("ring", "usp", "allgather", "a2a")
MIB = 2**20


def worker(seqs: list[int], repeats: int) -> list[dict]:
    """Time every strategy at every S in THIS interpreter; one dict per (strategy, S)."""
    sys.path.insert(0, str(HERE))
    import bench_attention as BA  # sets 8 CPU devices before JAX's backend starts
    import jax

    rows = []
    for S in seqs:
        inputs = BA.make_inputs(S, BA.N)
        for strategy in STRATEGIES:
            place, fwd, both, _lay = BA.lcx_contender(strategy, 8, 512, S)
            q, k, v, do = place(*inputs)
            t0 = time.perf_counter()
            c_fwd, c_both = fwd.lower(q, k, v).compile(), both.lower(q, k, v, do).compile()
            compile_s = time.perf_counter() - t0
            rows.append(
                {
                    "python": sys.version.split()[0],
                    "jax": jax.__version__,
                    "strategy": strategy,
                    "seq_len": S,
                    "fwd_s": BA.timed(c_fwd, (q, k, v), repeats),
                    "fwd_bwd_s": BA.timed(c_both, (q, k, v, do), repeats),
                    "fwd_temp_mib": c_fwd.memory_analysis().temp_size_in_bytes / MIB,
                    "fwd_bwd_temp_mib": c_both.memory_analysis().temp_size_in_bytes / MIB,
                    "compile_s": compile_s,
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", nargs="+", help="the interpreters to compare, floor first (each has lcx installed)")
    ap.add_argument("--seqs", type=int, nargs="+", default=[4096])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="runs per interpreter, alternated (A B A B)")
    ap.add_argument("--csv", type=pathlib.Path, default=HERE / "results" / "stack_benchmark.csv")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.seqs, args.repeats)))
        return 0
    if not args.python or len(args.python) < 2:
        ap.error(
            "--python needs the floor stack's interpreter and the current one, e.g. .venv/bin/python .venv312/bin/python"
        )
    if args.repeats < 3 or args.rounds < 1:
        ap.error(f"--repeats {args.repeats} / --rounds {args.rounds}: need >= 3 repeats and >= 1 round")
    sys.path.insert(0, str(HERE))
    import _common as C

    rows = []
    for r in range(args.rounds):
        for py in args.python:
            cmd = [py, __file__, "--worker", "--seqs", *map(str, args.seqs), "--repeats", str(args.repeats)]
            print(f"round {r + 1}/{args.rounds}: {py}", flush=True)
            out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
            rows += [{**row, "round": r + 1} for row in json.loads(out.splitlines()[-1])]
    C.write_csv(rows, args.csv)  # prints where it wrote
    return 0


if __name__ == "__main__":
    sys.exit(main())
