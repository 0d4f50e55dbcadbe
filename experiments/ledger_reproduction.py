"""Experiment (d): the cost ledger reproduces the published figures and MaxText's MFU table.

Every published value of ``experiment=ledger_reproduction`` (conf/experiment/
ledger_reproduction.yaml: Llama 3 70B FLOPs, KV-cache bytes, the ring overlap condition, the
causal imbalance of contiguous sharding -- the published worked long-context figures -- and MaxText's published
TFLOP/s and MFU of its long-context recipes) is recomputed by :mod:`lcx.cost` and compared at
the published precision (a value agrees when lcx's number, rounded -- or truncated, where the
source truncates -- to the published digits, equals it).

Writes ``experiments/results/ledger_reproduction.csv`` and ``.png``; exits 1 if any row
disagrees.

    python experiments/ledger_reproduction.py      # seconds; nothing compiles
"""

from __future__ import annotations

import argparse
import decimal
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _common as C  # noqa: E402

NAME = "ledger_reproduction"
GiB, TiB, MiB = 2**30, 2**40, 2**20


def agrees(value: float, published: str, truncated: bool = False) -> bool:
    """Whether ``value`` shown with ``published``'s digits (rounded half-up, or truncated) is it."""
    d = decimal.Decimal(published)
    q = decimal.Decimal(1).scaleb(d.as_tuple().exponent)
    mode = decimal.ROUND_DOWN if truncated else decimal.ROUND_HALF_UP
    return decimal.Decimal(repr(float(value))).quantize(q, rounding=mode) == d.quantize(q)


def rows_from(spec) -> list[dict]:
    """Recompute every published value of ``spec`` (the ``ledger_reproduction`` node)."""
    from omegaconf import OmegaConf

    from lcx import cost
    from lcx.models.presets import preset

    rows = []

    def add(section, quantity, published, value, unit, source, truncated=False):
        rows.append(
            {
                "section": section,
                "quantity": quantity,
                "published": published,
                "lcx": float(value),
                "unit": unit,
                "agrees": agrees(value, published, truncated),
                "source": source,
            }
        )

    m = preset("llama3_70b")
    p = spec.llama3_70b
    src = "published worked figures (Llama 3 70B)"
    d, Pl, L = m.d_model, m.params_per_layer, m.n_layers
    add("llama3_70b", "parameters per layer", p.params_per_layer, Pl, "parameters", src)
    add(
        "llama3_70b", "linear = quadratic prefill at n", p.crossover_tokens, cost.crossover_tokens(d, Pl), "tokens", src
    )
    lin, quad = cost.prefill_flops_per_layer(d, Pl, 8192)
    add("llama3_70b", "prefill linear FLOPs, 80 layers, n=8192", p.linear_flops_8k, L * lin, "FLOP", src)
    add("llama3_70b", "prefill quadratic FLOPs, 80 layers, n=8192", p.quadratic_flops_8k, L * quad, "FLOP", src)
    add("llama3_70b", "quadratic / linear at n=8192", p.quadratic_share_8k_pct, 100 * quad / lin, "%", src)
    lin, quad = cost.prefill_flops_per_layer(d, Pl, 10**6)
    add("llama3_70b", "prefill linear FLOPs, 80 layers, n=1M", p.linear_flops_1m, L * lin, "FLOP", src)
    add("llama3_70b", "prefill quadratic FLOPs, 80 layers, n=1M", p.quadratic_flops_1m, L * quad, "FLOP", src)
    add(
        "llama3_70b",
        "quadratic term at 1M on one 990 TFLOP/s H100",
        p.quadratic_seconds_1m_h100,
        L * quad / 990e12,
        "s",
        src,
    )
    kv = cost.kv_cache_bytes_per_token(L, m.n_kv_heads, m.head_dim, 2)
    add("llama3_70b", "KV cache per token (fp16)", p.kv_bytes_per_token_fp16, kv, "bytes", src)
    add("llama3_70b", "KV cache at 4,096 tokens", p.kv_gib_4k, kv * 4096 / GiB, "GiB", src)
    add("llama3_70b", "KV cache at 131,072 tokens", p.kv_gib_128k, kv * 131072 / GiB, "GiB", src)
    add("llama3_70b", "KV cache at 1M tokens", p.kv_gib_1m, kv * 10**6 / GiB, "GiB", src)
    mha = cost.kv_cache_bytes_per_token(L, m.n_heads, m.head_dim, 2)
    add("llama3_70b", "KV cache per token with 64 kv heads (MHA)", p.kv_mib_per_token_mha, mha / MiB, "MiB", src)
    add("llama3_70b", "KV cache at 1M tokens, MHA", p.kv_tib_1m_mha, mha * 10**6 / TiB, "TiB", src)
    for r in spec.ring_overlap_tokens:
        c = cost.ring_overlap_min_block(
            990e12,
            float(r.bandwidth),
            n_heads=m.n_heads,
            n_kv_heads=m.n_kv_heads if r.gqa else m.n_heads,
            bytes_per_element=2,
        )
        add(
            "ring_overlap",
            f"min ring block, {r.link}{', GQA' if r.gqa else ''}",
            r.published,
            c,
            "tokens",
            "published worked figures (ring overlap c >= F/B)",
        )
    for r in spec.causal_imbalance:
        add(
            "load_balance",
            f"contiguous causal max/mean work, P={r.degree}",
            r.published,
            cost.causal_imbalance("contiguous", int(r.degree)),
            "ratio",
            "published worked figures (causal imbalance)",
        )
    conf = C.ROOT / "conf" / "hardware"
    m8 = preset("llama3_1_8b_longctx")
    for r in spec.maxtext:
        hw = cost.hardware_from_config(OmegaConf.load(conf / f"{r.hardware}.yaml"), probe=False)
        f = cost.training_flops(m8, int(r.seq_len), int(r.global_batch))
        src = f"MaxText tpu-recipes ({r.recipe})"
        add(
            "maxtext",
            f"{r.recipe}: TFLOP/s per device",
            r.tflops_per_device,
            f.total / int(r.devices) / float(r.step_time_s) / 1e12,
            "TFLOP/s",
            src,
        )
        add(
            "maxtext",
            f"{r.recipe}: MFU",
            r.mfu_pct,
            100 * cost.mfu(f.total, float(r.step_time_s), hw.peak_flops_per_device, int(r.devices)),
            "%",
            src,
            truncated=bool(r.get("truncated", False)),
        )
    return rows


def plot(rows, path: pathlib.Path) -> pathlib.Path:
    plt = C.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(14, 6), gridspec_kw={"width_ratios": [1, 1.6]})
    mfu = [r for r in rows if r["section"] == "maxtext" and r["unit"] == "%"]
    xs = range(len(mfu))
    a.bar([x - 0.2 for x in xs], [float(r["published"]) for r in mfu], 0.4, label="MaxText published")
    a.bar([x + 0.2 for x in xs], [float(r["lcx"]) for r in mfu], 0.4, label="lcx ledger (from published step time)")
    a.set_xticks(list(xs), [r["quantity"].split(":")[0] for r in mfu])
    a.set_ylabel("MFU (%)")
    a.set_title("MaxText long-context MFU table")
    a.legend(fontsize=8)
    for x, r in zip(xs, mfu):
        a.text(x + 0.2, float(r["lcx"]) + 0.5, f"{float(r['lcx']):.2f}", ha="center", fontsize=8)
    ratios = [float(r["lcx"]) / float(r["published"]) for r in rows]
    ys = range(len(rows))
    b.scatter(ratios, ys, c=["tab:green" if str(r["agrees"]) == "True" else "tab:red" for r in rows])
    b.axvline(1.0, color="gray", lw=0.8)
    b.set_yticks(list(ys), [r["quantity"] for r in rows], fontsize=7)
    b.invert_yaxis()
    lo, hi = min(ratios + [0.99]), max(ratios + [1.01])
    b.set_xlim(lo - 0.005, hi + 0.005)
    b.set_xlabel("lcx / published (green: agrees at the published precision)")
    b.set_title("every published figure recomputed by lcx.cost")
    return C.save_figure(fig, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, default=C.RESULTS / NAME)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    rows = rows_from(C.compose(NAME, a.overrides).ledger_reproduction)
    C.write_csv(rows, C.out_file(a.out, ".csv"))
    plot(rows, C.out_file(a.out, ".png"))
    bad = [r for r in rows if not r["agrees"]]
    for r in bad:
        print(f"DISAGREES: {r['quantity']}: published {r['published']}, lcx {r['lcx']:.6g}", file=sys.stderr)
    print(f"{len(rows) - len(bad)}/{len(rows)} published values reproduced")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
