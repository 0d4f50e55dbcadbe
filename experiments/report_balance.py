"""Renderers of the packed-document load-balance tables (docs/load_balance_documents.md) for
``experiments/report.py``."""

from __future__ import annotations

import _common as C

LAYOUTS = ("contiguous", "zigzag", "balanced")


def _cells() -> dict[tuple[str, int, int], dict[str, dict[str, str]]]:
    out: dict[tuple[str, int, int], dict[str, dict[str, str]]] = {}
    for r in C.read_csv(C.RESULTS / "load_balance_documents.csv"):
        out.setdefault((r["data"], int(r["seq_len"]), int(r["P"])), {})[r["layout"]] = r
    return out


def load_balance_documents() -> str:
    """Per (data, S, P): max/mean visible pairs (mean over rows, worst row in brackets) and
    executed / visible tiles of each layout, and the balanced layout's host cost per row."""
    head = ["data", "S", "P", "rows", "tile"]
    head += [f"{lay} max/mean (worst)" for lay in LAYOUTS]
    head += [f"{lay} executed/visible tiles" for lay in LAYOUTS] + ["balanced layout, ms per row"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for (data, S, P), by in _cells().items():
        row = [data, f"{S // 1024}K", str(P), by["balanced"]["rows"], by["balanced"]["block"]]
        row += [
            f"{float(by[lay]['max_over_mean']):.3f} ({float(by[lay]['max_over_mean_worst']):.3f})" for lay in LAYOUTS
        ]
        row += [f"{float(by[lay]['executed_over_visible_tiles']):.3f}" for lay in LAYOUTS]
        row.append(f"{float(by['balanced']['layout_ms']):.1f}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def packed_imbalance_table() -> str:
    """``lcx.cost.balance.PACKED_IMBALANCE`` as the CSV's stdlib rows give it (Python source)."""
    cells = _cells()
    out = []
    for lay in LAYOUTS:
        items = ", ".join(
            f"({S}, {P}): {float(by[lay]['max_over_mean']):.3f}"
            for (data, S, P), by in cells.items()
            if data == "stdlib"
        )
        out.append(f'    "{lay}": {{{items}}},')
    return "\n".join(out)
