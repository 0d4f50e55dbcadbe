"""Renderers of the time-model tables (docs/time_model.md) for ``experiments/report.py``."""

from __future__ import annotations

import statistics

import _common as C

SOURCES = {
    "tpu_recipes": "tpu-recipes",
    "maxtext_pr_4893": "PR #4893",
    "maxtext_pr_4836": "PR #4836",
    "maxtext_pr_4687": "PR #4687",
}


def _pct(x: str) -> str:
    return f"{round(100 * float(x), 1) + 0.0:+.1f}%"  # + 0.0: a rounded -0.0 prints +0.0


def ledger_calibration() -> str:
    """``experiments/ledger_calibration.py``: every published step, fitted or held out."""
    rows = C.read_csv(C.RESULTS / "ledger_calibration.csv")
    out = [
        "| source | row | used | published s | predicted s | error | roofline error |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        label = r["row"].removeprefix(f"{r['source']} ")
        used = "fit" if r["fitted"] == "True" else "**held out**"
        out.append(
            f"| {SOURCES[r['source']]} | {label} | {used} | {float(r['published_s']):,.2f} | "
            f"{float(r['predicted_s']):,.2f} | {_pct(r['error'])} | {_pct(r['roofline_error'])} |"
        )
    return "\n".join(out)


def ledger_calibration_summary() -> str:
    """The held-out summary line of ``ledger_calibration.csv``."""
    rows = C.read_csv(C.RESULTS / "ledger_calibration.csv")
    held = [abs(float(r["error"])) for r in rows if r["fitted"] != "True"]
    fit = [abs(float(r["error"])) for r in rows if r["fitted"] == "True"]
    roof = [abs(float(r["roofline_error"])) for r in rows]
    return (
        f"**Held out: {len(held)} rows, median |error| {100 * statistics.median(held):.1f}%, largest "
        f"{100 * max(held):.1f}%; {sum(e <= 0.2 for e in held)} of {len(held)} within 20%.** Fitted: "
        f"{len(fit)} rows, median {100 * statistics.median(fit):.1f}%, largest {100 * max(fit):.1f}%. The "
        f"roofline misses every row by {100 * min(roof):.0f}-{100 * max(roof):.0f}%."
    )


def ledger_calibration_ranking() -> str:
    """``ledger_calibration_ranking.csv``: the count, and every pair ordered unlike the measurement."""
    pairs = C.read_csv(C.RESULTS / "ledger_calibration_ranking.csv")
    bad = [p for p in pairs if p["agrees"] != "True"]
    # a fixed line, not one drawn from the misses: pairs measured more than 5% apart
    wide = [p for p in pairs if float(p["measured_gap"]) > 0.05]
    lines = [
        f"Of the {len(pairs)} pairs of strategies measured at the same length by the same PR, "
        f"{len(pairs) - len(bad)} are ordered as measured; of the {len(wide)} pairs measured more than 5% apart "
        f"({sum(p['held_out'] == 'True' for p in wide)} of them with a held-out row), "
        f"{sum(p['agrees'] == 'True' for p in wide)} are. Ordered unlike the measurement:",
        "",
        "| comparison, length | pair | measured gap | predicted gap | a held-out row |",
        "|---|---|---:|---:|---|",
    ]
    for p in bad:
        lines.append(
            f"| {_comparison(p['group'])} | {p['pair']} | {100 * float(p['measured_gap']):.1f}% | "
            f"{100 * float(p['predicted_gap']):.1f}% | {'yes' if p['held_out'] == 'True' else 'no'} |"
        )
    # the planner's tie rule (lcx.reports.timing.versus_words): a predicted gap under the preset's
    # held-out median error; every comparison is on v5p
    from omegaconf import OmegaConf

    band = float(OmegaConf.load(C.ROOT / "conf" / "hardware" / "tpu_v5p.yaml").time_model.error_median)
    close = [p for p in pairs if float(p["predicted_gap"]) < band]
    far = [p for p in pairs if float(p["predicted_gap"]) >= band]
    lines += [
        "",
        f"The planner calls two plans 'a tie' when their predicted steps are closer than the preset's held-out "
        f"median error ({100 * band:.1f}% for tpu_v5p). Of the {len(close)} pairs predicted that close, "
        f"{sum(p['agrees'] == 'True' for p in close)} are ordered as measured; of the {len(far)} pairs predicted "
        f"farther apart, {sum(p['agrees'] == 'True' for p in far)} are.",
    ]
    return "\n".join(lines)


def _comparison(group: str) -> str:
    src, S = group.rsplit(" ", 1)
    return f"{SOURCES[src]}, {int(S) // 1024}K"


def ledger_calibration_choice() -> str:
    """``ledger_calibration_choice.csv``: what picking the strategy by the prediction costs."""
    picks = C.read_csv(C.RESULTS / "ledger_calibration_choice.csv")
    regret = [float(c["regret"]) for c in picks]
    lines = [
        "| comparison, length | strategies | predicted fastest | measured fastest | the pick's measured step |",
        "|---|---:|---|---|---:|",
    ]
    for c in picks:
        lines.append(
            f"| {_comparison(c['group'])} | {c['strategies']} | {c['predicted_fastest']} | {c['measured_fastest']} | "
            f"{_pct(c['regret'])} |"
        )
    lines += [
        "",
        f"**The strategy predicted fastest is the one measured fastest in {sum(r == 0 for r in regret)} of "
        f"{len(picks)} comparisons; where it is not, its measured step is {100 * max(regret):.1f}% or less "
        f"slower than the fastest.**",
    ]
    return "\n".join(lines)


PARAMETERS = (
    ("attention_efficiency", "splash"),
    ("attention_efficiency", "tokamax"),
    ("linear_efficiency", None),
    ("mxu_dim", None),
    ("kernel_call_s", None),
    ("collective_latency_s", None),
    ("split_all_to_all_s", None),
    ("ici_efficiency", None),
    ("ring_link_efficiency", None),
    ("ring_overlap", None),
    ("replay_efficiency", None),
    ("skipped_tile_s", None),
    ("error_median", None),
    ("error_max", None),
)


def time_model_parameters() -> str:
    """The TPU presets' ``time_model`` values, as the YAML files carry them."""
    from omegaconf import OmegaConf

    tms = {hw: OmegaConf.load(C.ROOT / "conf" / "hardware" / f"{hw}.yaml").time_model for hw in ("tpu_v5p", "tpu7")}
    out = ["| parameter | tpu_v5p | tpu7 |", "|---|---:|---:|"]
    for key, sub in PARAMETERS:
        cells = []
        for tm in tms.values():
            v = tm[key] if sub is None else tm[key].get(sub)
            cells.append("-" if v is None else f"{v:.4g}")
        out.append(f"| {key}{f' ({sub})' if sub else ''} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def ledger_calibration_torus() -> str:
    """PR #4687's Ulysses and all-gather steps with their collectives priced on the slice's torus
    (docs/time_model.md, "What the torus does not explain"): arithmetic on the rows' StepWork and
    the shipped tpu_v5p time model; nothing is fitted.

    The context group of 16 on the 4x4x4 slice is two whole torus axes (a plane, ``2 k`` of the
    chip's links for ``k`` axes). An all-to-all of ``v`` bytes per device there loads each link
    with ``v a / 4`` bytes (a part travels ``a / 4`` hops on average along a ring of ``a``, and the
    ring's ``a`` links share the traffic), at one link's bidirectional bandwidth; an all-gather
    receives over the plane's links only."""
    import dataclasses

    from _calibration_fit import gap
    from ledger_calibration import comparison_rows
    from omegaconf import OmegaConf

    from lcx import cost
    from lcx.cost.topology import subtorus_axes

    spec = OmegaConf.load(C.ROOT / "conf" / "experiment" / "ledger_calibration.yaml").ledger_calibration
    rows = {r.strategy: r for r in comparison_rows(spec) if r.source == "maxtext_pr_4687"}
    hw = cost.hardware_from_config(OmegaConf.load(C.ROOT / "conf" / "hardware" / "tpu_v5p.yaml"), probe=False)
    tm = hw.time_model
    c = next(c for c in spec.comparisons if c.source == "maxtext_pr_4687")
    P = int(c.devices) // int(c.data)  # the context degree: CP 16 (data 4)
    axes = subtorus_axes(P, hw.physical_mesh(int(c.devices)))
    assert axes, f"PR #4687's context group of {P} is no whole sub-torus"
    link = hw.ici_bandwidth_per_chip / hw.ici_links_per_chip  # bytes/s, both ways, one link
    # what the torus makes of each byte the model prices at the chip's whole bandwidth
    # (StepWork.collective_bandwidth): an all-to-all's v (P-1)/P bytes load a link with v a / 4
    # at one link's rate; an all-gather receives over 2 k of the chip's links
    a2a = P / (P - 1) * max(axes) / 4 * hw.collective_bandwidth_per_device / link
    gather = hw.ici_links_per_chip / (2 * len(axes))
    out = [
        "| PR #4687, 32K | measured s | predicted s | error | collective, on the "
        f"{' x '.join(map(str, axes))} torus group | predicted s | error |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    totals = {}
    for name, what, field, factor in (
        ("a2a", "all-to-all", "all_to_all_bytes", a2a),
        ("allgather", "K/V all-gather", "kv_gather_bytes", gather),
    ):
        r = rows[name]
        w = r.work
        torus_w = dataclasses.replace(w, **{field: getattr(w, field) * factor})
        now, torus = (getattr(x, field) / (x.collective_bandwidth * tm.ici_efficiency) for x in (w, torus_w))
        totals[name] = (tm.time(w, r.peak).total, tm.time(torus_w, r.peak).total)
        before, after = totals[name]
        out.append(
            f"| {name} | {r.published_s:.2f} | {before:.2f} | {_pct(before / r.published_s - 1)} | "
            f"{what} {now:.2f} s -> {torus:.2f} s | {after:.2f} | {_pct(after / r.published_s - 1)} |"
        )
    a, b = rows["a2a"].published_s, rows["allgather"].published_s
    out += [
        "",
        f"Predicted apart: {100 * gap(*(t[0] for t in totals.values())):.1f}% by the presets, "
        f"{100 * gap(*(t[1] for t in totals.values())):.1f}% on the torus; measured {100 * gap(a, b):.1f}% "
        f"apart, the {'all-gather' if b < a else 'Ulysses'} step the faster.",
    ]
    return "\n".join(out)
