"""Render the committed result CSVs into the docs' tables, so no number in the docs is typed.

Each table sits in a docs page between ``<!-- BEGIN <table> -->`` and ``<!-- END <table> -->``
markers; this script replaces what is between them with a fresh rendering of the CSV it names
(tables are listed in :data:`TABLES`). Run it after any experiment script:

    python experiments/report.py            # rewrites the marked tables in docs/*.md
    python experiments/report.py --check    # exit 1 if a page is out of date
"""

from __future__ import annotations

import argparse
import pathlib
import re
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _common as C  # noqa: E402
from report_balance import load_balance_documents  # noqa: E402
from report_time import (  # noqa: E402
    ledger_calibration,
    ledger_calibration_choice,
    ledger_calibration_ranking,
    ledger_calibration_summary,
    ledger_calibration_torus,
    time_model_parameters,
)

RES = C.RESULTS
DOCS = C.ROOT / "docs"


def _f(x, nd=1) -> str:
    if x in ("", None):
        return "-"
    try:
        v = float(x)
    except ValueError:
        return str(x)
    if v != v:
        return "-"
    return f"{v:,.{nd}f}"


def _md(header, rows, left=(0,)) -> str:
    """A markdown table; the columns whose indices are in ``left`` are left-aligned, the rest right."""
    out = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if i in left else "---:" for i in range(len(header))) + "|",
    ]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def strategy_benchmark() -> str:
    rows = [r for r in C.read_csv(DOCS / "strategy_benchmark.csv") if r["sweep"] == "strategies"]
    return _md(
        ["strategy", "S (tokens)", "fwd temp / device (MiB)", "fwd+bwd temp / device (MiB)", "fwd+bwd time (s)"],
        [
            [r["strategy"], r["seq_len"], _f(r["fwd_temp_mib"]), _f(r["fwd_bwd_temp_mib"]), _f(r["fwd_bwd_s"], 2)]
            for r in rows
        ],
    )


def bench_halo() -> str:
    """experiments/bench_halo.py: one sliding-window layer under halo, ring and all-gather."""
    rows = C.read_csv(RES / "bench_halo.csv")
    mib = lambda x: _f(float(x) / 2**20, 2)
    return _md(
        [
            "strategy",
            "sent / device, HLO (MiB)",
            "sent / device, ledger (MiB)",
            "HLO bytes / halo's",
            "fwd+bwd (s, median)",
            "time / halo's",
            "collectives in the HLO (bytes)",
        ],
        [
            [
                r["strategy"],
                mib(r["hlo_bytes_per_device"]),
                mib(r["ledger_bytes_per_device"]),
                _f(r["hlo_bytes_over_halo"], 1),
                _f(r["fwd_bwd_s"], 2),
                _f(r["time_over_halo"], 2),
                r["hlo_collectives"].replace(";", ", "),
            ]
            for r in rows
        ],
    )


def bench_halo_setup() -> str:
    """The shapes and provenance of bench_halo.csv (one line)."""
    r = C.read_csv(RES / "bench_halo.csv")[0]
    return (
        f"S = {int(r['seq_len']):,} tokens, W = {int(r['window']):,}, P = {r['devices']} simulated CPU devices "
        f"({r['machine']}), B = {r['batch']}, {r['heads']} query / {r['kv_heads']} kv head(s) of {r['head_dim']}, "
        f"{r['dtype']}, {r['layout']} layout, {r['kernel']} kernel with {r['block']}-token blocks; median of "
        f"{r['repeats']} interleaved rounds; lcx {r['git_commit']}, python {r['python']}, jax {r['jax']}."
    )


def bench_generate() -> str:
    """experiments/bench_generate.py: CP generation at long context against one device."""
    rows = C.read_csv(RES / "bench_generate.csv")
    mib = lambda x: _f(float(x) / 2**20, 3)
    return _md(
        [
            "model (layer kinds)",
            "devices",
            "prefill (s)",
            "prefill / one device's",
            "decode (tokens/s)",
            "KV cache / device, ledger (MiB)",
            "KV cache / device, compiled (MiB)",
            "ledger / compiled",
            "cache / one device's",
        ],
        [
            [
                f"{r['model']} ({r['kinds']}, {r['layers']} layers)",
                r["devices"],
                _f(r["prefill_s"], 2),
                _f(r["prefill_over_one_device"], 2),
                _f(r["decode_tokens_per_s"], 1),
                mib(r["kv_ledger_bytes"]),
                mib(r["kv_compiled_bytes"]),
                _f(r["ledger_over_compiled"], 4),
                _f(r["kv_fraction_of_one_device"], 4),
            ]
            for r in rows
        ],
        left=(0,),
    )


def generate_exactness() -> str:
    """experiments/generate_exactness.py: CP greedy decoding against one device and teacher forcing."""
    rows = C.read_csv(RES / "generate_exactness.csv")
    yes = lambda x: "yes" if x == "True" else "**no**"
    return _md(
        [
            "model",
            "strategy",
            "layout",
            "mesh",
            "kernel",
            "tokens = one device's",
            "tokens = teacher argmax",
            "max logit error vs teacher forcing",
            "vs one device's decoding",
        ],
        [
            [
                r["model"],
                r["strategy"],
                r["layout"],
                r["mesh"],
                r["kernel"],
                yes(r["tokens_equal_one_device"]),
                yes(r["tokens_equal_teacher_argmax"]),
                r["max_logit_err_vs_teacher"],
                r["max_logit_err_vs_one_device"],
            ]
            for r in rows
        ],
        left=(0, 1, 2, 3, 4),
    ) + (f"\n\nlcx {rows[0]['git_commit']}, python {rows[0]['python']}, jax {rows[0]['jax']}." if rows else "")


def bench_generate_setup() -> str:
    """The shapes and provenance of bench_generate.csv (one line)."""
    r = C.read_csv(RES / "bench_generate.csv")[0]
    return (
        f"One prompt of {int(r['seq_len']):,} tokens, {r['new_tokens']} greedy tokens generated, float32, "
        f"{r['machine']} (P = 8 is 8 simulated devices on these cores); median of {r['repeats']} runs after a "
        f"warm-up; lcx {r['git_commit']}, python {r['python']}, jax {r['jax']}."
    )


def strategy_memory() -> str:
    """The memory-only run of ``experiments/bench_strategies.py`` (``strategy_memory.csv``)."""
    rows = [r for r in C.read_csv(RES / "strategy_memory.csv") if r["sweep"] == "strategies"]
    return _md(
        ["strategy", "S (tokens)", "fwd temp / device (MiB)", "fwd+bwd temp / device (MiB)"],
        [[r["strategy"], r["seq_len"], _f(r["fwd_temp_mib"]), _f(r["fwd_bwd_temp_mib"])] for r in rows],
    )


def ring_degree_memory() -> str:
    return ring_degree(RES / "strategy_memory.csv")


def ring_degree(path: pathlib.Path = DOCS / "strategy_benchmark.csv") -> str:
    rows = [r for r in C.read_csv(path) if r["sweep"] == "ring_degree"]
    return _md(
        ["ring devices P", "S (tokens)", "tokens / device", "fwd temp / device (MiB)", "fwd+bwd temp / device (MiB)"],
        [
            [
                r["devices"],
                r["seq_len"],
                int(r["seq_len"]) // int(r["devices"]),
                _f(r["fwd_temp_mib"]),
                _f(r["fwd_bwd_temp_mib"]),
            ]
            for r in rows
        ],
    )


def strategy_sweep() -> str:
    rows = C.read_csv(RES / "strategy_sweep.csv")
    return _md(
        ["plan", "mesh", "S (tokens)", "tokens/s (8 devices)", "train-step temp / device (MiB)", "loss by step"],
        [
            [
                r["plan"],
                r["mesh"],
                r["seq_len"],
                _f(r["tokens_per_sec"], 0),
                _f(r["temp_mib_per_device"]),
                ", ".join(f"{float(x):.4f}" for x in r["losses"].split(";")),
            ]
            for r in rows
        ],
    )


def load_balance() -> str:
    rows = C.read_csv(RES / "load_balance.csv")
    groups = defaultdict(list)
    for r in rows:
        groups[(r["layout"], int(r["degree"]))].append(r)
    out = []
    for (layout, P), rs in sorted(groups.items(), key=lambda t: (t[0][1], t[0][0])):
        pairs = [int(r["pairs"]) for r in rs]
        times = [float(r["fwd_bwd_s"]) for r in rs if r.get("fwd_bwd_s") not in ("", None)]
        out.append(
            [
                layout,
                P,
                rs[0]["seq_len"],
                f"{min(pairs):,} .. {max(pairs):,}",
                _f(max(pairs) / (sum(pairs) / len(pairs)), 3),
                f"{min(times):.3f} .. {max(times):.3f}" if times else "-",
                _f(max(times) / (sum(times) / len(times)), 2) if times else "-",
            ]
        )
    return _md(
        [
            "layout",
            "P",
            "S",
            "visible pairs per device (min .. max)",
            "work max/mean",
            "fwd+bwd s per device (min .. max)",
            "time max/mean",
        ],
        out,
    )


def memory_vs_degree() -> str:
    rows = C.read_csv(RES / "memory_vs_degree.csv")
    return _md(
        ["strategy", "S", "P", "tokens / device", "temp (MiB)", "total (MiB)", "ledger (MiB)", "note"],
        [
            [
                r["strategy"],
                r["seq_len"],
                r["degree"],
                r["tokens_per_device"],
                _f(r["temp_mib"]),
                _f(r["total_mib"]),
                _f(r["ledger_mib"]),
                ("refused: " + r["refused"][:90]) if r["refused"] else "",
            ]
            for r in rows
        ],
    )


def ledger_vs_compiled() -> str:
    rows = C.read_csv(RES / "ledger_vs_compiled.csv")
    return _md(
        ["strategy", "S", "remat", "batch", "ledger (MiB)", "compiled (MiB)", "ledger / compiled"],
        [
            [
                r["strategy"],
                r["seq_len"],
                r["remat"],
                r["global_batch"],
                _f(r["ledger_mib"]),
                _f(r["compiled_mib"]),
                _f(r["ratio"], 2),
            ]
            for r in rows
        ],
    )


def vocab_tiling_offload() -> str:
    """``experiments/vocab_tiling_offload.py``: compiled vs ledger bytes per device, MiB (docs/cost_ledger.md)."""
    rows = C.read_csv(RES / "vocab_tiling_offload.csv")

    def host(x) -> str:
        return "0" if float(x) == 0 else _f(x, 3)

    return _md(
        [
            "N",
            "offload",
            "compiled device",
            "ledger device",
            "ratio",
            "compiled host",
            "ledger host",
            "ratio",
            "accel device",
            "accel host",
            "largest V buffer",
        ],
        [
            [
                r["vocab_tiling"],
                "on" if r["offload"] == "True" else "off",
                _f(r["compiled_device_mib"], 2),
                _f(r["ledger_device_mib"], 2),
                _f(r["ratio_device"], 3),
                host(r["compiled_host_mib"]),
                host(r["ledger_host_mib"]),
                _f(r["ratio_host"], 3),
                _f(r["accel_device_mib"], 2),
                _f(r["accel_host_mib"], 3),
                r["largest_v_shape"],
            ]
            for r in rows
        ],
        left=(1, 10),
    )


def g(x) -> str:
    """A computed value: 4 significant digits in scientific notation above 1e7, else up to 4 decimals."""
    v = float(x)
    return f"{v:.4g}" if abs(v) >= 1e7 else f"{v:,.4f}".rstrip("0").rstrip(".")


def ledger_reproduction() -> str:
    rows = C.read_csv(RES / "ledger_reproduction.csv")
    return _md(
        ["quantity", "unit", "published", "lcx.cost", "agrees"],
        [
            [r["quantity"], r["unit"], r["published"], g(r["lcx"]), "yes" if r["agrees"] == "True" else "**no**"]
            for r in rows
        ],
    )


def ring_overlap() -> str:
    rows = [r for r in C.read_csv(RES / "ledger_reproduction.csv") if r["section"] in ("ring_overlap", "load_balance")]
    return _md(
        ["quantity", "unit", "published", "lcx.cost", "agrees"],
        [
            [r["quantity"], r["unit"], r["published"], g(r["lcx"]), "yes" if r["agrees"] == "True" else "**no**"]
            for r in rows
        ],
    )


def passkey(name: str = "passkey") -> str:
    rows = C.read_csv(RES / f"{name}.csv")
    return _md(
        ["depth", "key -> answer (tokens)", "rows", "exact match", "per-digit accuracy", "after step"],
        [
            [
                r["depth"],
                r["key_to_answer_tokens"],
                r["rows"],
                _f(r["exact_match"], 2),
                _f(r["digit_accuracy"], 2),
                r["step"],
            ]
            for r in rows
        ],
    )


def passkey_dense() -> str:
    return passkey("passkey_dense")


def passkey_1024only() -> str:
    return passkey("passkey_1024only")


def passkey_summary() -> str:
    out = []
    for name, setup in (
        (
            "passkey",
            "4 kv heads; curriculum 256 -> 512 -> 1024 tokens (2500 + 600 + 1500 steps), plain RoPE "
            "(experiment=passkey as committed)",
        ),
        ("passkey_1kv", "1 kv head (the tiny preset); curriculum 256 -> 512 -> 1024 tokens (2500 + 600 + 600 steps)"),
        (
            "passkey_stage256",
            "1 kv head; that curriculum's first stage alone (2500 steps at 256 tokens), at 256 tokens",
        ),
        ("passkey_yarn_2stage", "1 kv head; 256 -> 1024 tokens in one jump with YaRN x4 (2500 + 400 steps)"),
        ("passkey_1024only", "1 kv head; 1024 tokens only, 8 rows/step, answer-digit loss (+ the key's repeat)"),
        ("passkey_dense", "1 kv head; 1024 tokens only, loss on every token, filler of repeated random sentences"),
    ):
        try:
            rows = C.read_csv(RES / f"{name}.csv")
        except FileNotFoundError:
            continue
        n = sum(int(r["rows"]) for r in rows)
        em = sum(float(r["exact_match"]) * int(r["rows"]) for r in rows) / n
        da = sum(float(r["digit_accuracy"]) * int(r["rows"]) for r in rows) / n
        idx = sorted((k for k in rows[0] if k.startswith("digit_") and k[6:].isdigit()), key=lambda k: int(k[6:]))
        by_index = " / ".join(_f(sum(float(r[k]) * int(r["rows"]) for r in rows) / n, 2) for k in idx) if idx else "-"
        out.append(
            [
                setup,
                rows[0]["seq_len"],
                f"{rows[0]['strategy']} x{rows[0]['context_degree']}",
                rows[0]["step"],
                n,
                _f(em, 3),
                _f(da, 3),
                by_index,
            ]
        )
    return _md(
        [
            "training",
            "S",
            "strategy",
            "steps",
            "eval rows",
            "exact match",
            "per-digit accuracy",
            "accuracy of answer digit 1 / 2 / 3 / 4 / 5",
        ],
        out,
    )


def stack_benchmark() -> str:
    """experiments/bench_stacks.py: per (strategy, S), the median over rounds on each stack (the
    floor first, as run) and current / floor."""
    rows = C.read_csv(RES / "stack_benchmark.csv")
    stacks = list(dict.fromkeys(r["jax"] for r in rows))
    if len(stacks) != 2:
        raise ValueError(f"stack_benchmark.csv holds jax versions {stacks}; bench_stacks.py compares two stacks")
    cell = defaultdict(list)
    for r in rows:
        cell[(r["strategy"], r["seq_len"], r["jax"])].append(r)
    out = []
    for strategy, seq in dict.fromkeys((r["strategy"], r["seq_len"]) for r in rows):
        line = [strategy, seq]
        for col, nd in (("fwd_s", 3), ("fwd_bwd_s", 3), ("fwd_bwd_temp_mib", 1)):
            floor, cur = (statistics.median(float(r[col]) for r in cell[(strategy, seq, j)]) for j in stacks)
            line += [_f(floor, nd), _f(cur, nd), _f(cur / floor, 2)]
        out.append(line)
    header = ["strategy", "S (tokens)"]
    for name in ("fwd (s)", "fwd+bwd (s)", "fwd+bwd temp / device (MiB)"):
        header += [f"{name}, jax {stacks[0]}", f"{name}, jax {stacks[1]}", "ratio"]
    return _md(header, out)


def default_run() -> str:
    """The README's main job over seeds on each stack (``experiments/default_run.py``)."""
    import default_run as D

    rows = C.read_csv(RES / "default_run.csv")
    body = [
        [
            r["stack"],
            r["seed"],
            _f(r["final_val_loss"], 4),
            _f(r["final_loss"], 3),
            f"{100 * float(r['max_rise']):.1f}%",
            _f(r["max_grad_norm"], 1),
            f"{r['python']} / {r['jax']}",
            r["git_commit"],
        ]
        for r in rows
    ]
    for stack in sorted({r["stack"] for r in rows}):
        mean, sd, n = D.band(rows, stack)
        body.append([f"**{stack}**", f"{n} seeds", f"**{mean:.4f} +- {sd:.4f}**", "", "", "", "", ""])
    return _md(
        [
            "stack",
            "seed",
            "final val. loss",
            "last train loss",
            "largest rise",
            "largest grad norm",
            "python / jax",
            "commit",
        ],
        body,
        left=(0, 6, 7),
    )


def data_pipeline() -> str:
    """``experiments/data_pipeline.py``: the grain pipeline's tokens/s next to the model's."""
    rows = C.read_csv(RES / "data_pipeline.csv")
    what = {
        "bpe_train": "train the byte-level BPE",
        "tokenize": "tokenize the training documents (grain)",
        "stream": "training stream: pack, batch, layout (grain)",
        "model": "the README's run trains (tiny model)",
    }
    out = []
    for r in rows:
        wait = f"{float(r['wait_fraction']) * 100:.3f}% ({_f(r['data_wait_s'], 5)} s)" if r["wait_fraction"] else "-"
        out.append(
            [
                what[r["measure"]],
                f"{r['tokenizer']} ({int(r['vocab']):,})",
                r["workers"] or "-",
                f"{int(r['seq_len']):,} x {r['global_batch']}" if r["seq_len"] else "-",
                _f(r["tokens_per_s"], 0),
                _f(r["seconds"] or r["step_time_s"], 2),
                wait,
            ]
        )
    return _md(
        [
            "stage",
            "tokenizer (vocab)",
            "workers",
            "tokens x rows",
            "tokens/s",
            "seconds (run: per step)",
            "data wait / step (median)",
        ],
        out,
        left=(0, 1),
    )


TABLES = {
    f.__name__: f
    for f in (
        default_run,
        strategy_benchmark,
        bench_halo,
        bench_halo_setup,
        bench_generate,
        bench_generate_setup,
        generate_exactness,
        ring_degree,
        strategy_memory,
        ring_degree_memory,
        strategy_sweep,
        load_balance,
        memory_vs_degree,
        ledger_vs_compiled,
        vocab_tiling_offload,
        ledger_reproduction,
        ring_overlap,
        passkey,
        passkey_dense,
        passkey_1024only,
        passkey_summary,
        stack_benchmark,
        ledger_calibration,
        ledger_calibration_summary,
        ledger_calibration_ranking,
        ledger_calibration_choice,
        ledger_calibration_torus,
        time_model_parameters,
        load_balance_documents,
        data_pipeline,
    )
}
PATTERN = re.compile(r"(<!-- BEGIN (\w+) -->\n)(.*?)(<!-- END \2 -->)", re.S)


def render(text: str) -> str:
    def sub(m):
        name = m.group(2)
        try:
            body = TABLES[name]()
        except FileNotFoundError as e:
            body = f"*(no results yet: {e.filename} is missing; run the experiment)*"
        return m.group(1) + body + "\n" + m.group(4)

    return PATTERN.sub(sub, text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    stale = []
    for page in sorted(DOCS.glob("*.md")):
        old = page.read_text()
        if "<!-- BEGIN " not in old:
            continue
        new = render(old)
        if new != old:
            stale.append(page.name)
            if not a.check:
                page.write_text(new)
                print(f"updated {C.rel(page)}")
    if a.check and stale:
        print("out of date: " + ", ".join(stale) + " (run python experiments/report.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
