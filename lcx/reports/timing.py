"""The time model's predictions in words, as ``lcx.plan`` prints them: a step's calibrated time
beside the roofline with the preset's held-out error band (:func:`time_words`), and an
alternative plan's gap to the recommendation, a tie or an extrapolation (:func:`versus_words`).

Text only, from an :class:`~lcx.cost.ledger.Estimate` and the preset's
:class:`~lcx.cost.timing.TimeModel` (:mod:`lcx.cost.timing` holds the arithmetic); where a case
lies outside the model's :class:`~lcx.cost.timing.CalibratedRange` is :func:`outside`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lcx.cost.timing import CalibratedRange


def time_words(e: Any, hw: Any, *, seq_len: int, strategy: str | Mapping[str, str], kernel: str | None) -> str:
    """The predicted step of estimate ``e`` in words: the calibrated time and MFU beside the
    roofline, the preset's held-out error band, and whether the case extrapolates.

    Args:
      e: an :class:`lcx.cost.Estimate`; hw: its :class:`lcx.cost.Hardware`.
      seq_len: tokens per sequence; strategy, kernel: the plan's context strategy (one name, or
        one per layer kind) and kernel.
    """
    roof = f"roofline {e.roofline_step_time:,.1f} s/step, MFU {100 * e.roofline_mfu:.1f}%"
    tm = hw.time_model
    if tm is None or not e.calibrated:
        return f"{roof} (no time model for hardware={hw.name}: an upper bound, not a prediction)"
    out = f"calibrated {e.step_time:,.1f} s/step, MFU {100 * e.mfu:.1f}% ({roof})"
    if tm.error_median is not None and tm.error_max is not None:
        out += f"; held-out error of the {hw.name} time model: median {100 * tm.error_median:.1f}%, largest {100 * tm.error_max:.1f}%"
    if tm.calibrated is not None:
        far = _outside(tm, e, seq_len=seq_len, strategy=strategy, kernel=kernel)
        out += "; EXTRAPOLATION: " + "; ".join(far) if far else "; inside the calibrated range"
    return out


def outside(
    r: CalibratedRange, *, seq_len: int, tokens_per_device: float, strategy: str | Mapping[str, str], kernel: str
) -> list[str]:
    """What of a case lies outside the calibrated range ``r``, in words (empty: inside);
    ``strategy``: one name, or a mapping layer kind -> name (each name is checked)."""
    out = []
    lo, hi = r.seq_len
    if not lo <= seq_len <= hi:
        out.append(f"seq_len {seq_len:,} outside {lo:,}..{hi:,}")
    lo, hi = r.tokens_per_device
    if not lo <= tokens_per_device <= hi:
        out.append(f"{tokens_per_device:,.0f} tokens per device outside {lo:,}..{hi:,}")
    names = (strategy,) if isinstance(strategy, str) else tuple(dict.fromkeys(strategy.values()))
    for name in (n for n in names if r.strategies and n not in r.strategies):
        out.append(f"strategy {name} not among the measured {', '.join(r.strategies)}")
    if r.kernels and kernel not in r.kernels:
        out.append(f"kernel {kernel} not among the measured {', '.join(r.kernels)}")
    return out


def _outside(tm: Any, e: Any, *, seq_len: int, strategy: str | Mapping[str, str], kernel: str | None) -> list[str]:
    """What of estimate ``e``'s case lies outside ``tm``'s calibrated range, in words."""
    return outside(
        tm.calibrated,
        seq_len=seq_len,
        tokens_per_device=e.tokens_per_step / e.n_devices,
        strategy=strategy,
        kernel=kernel or "xla",
    )


def versus_words(
    alt: Any,
    best: Any,
    hw: Any,
    *,
    seq_len: int,
    strategy: str | Mapping[str, str],
    kernel: str | None,
    best_strategy: str | Mapping[str, str],
    best_kernel: str | None,
) -> tuple[str, bool]:
    """How an alternative plan's predicted step compares with the recommended one, in words.

    The gap is ``alt / best - 1`` of the calibrated step times, printed to 0.1%. A gap that prints
    smaller than the preset's held-out median error (``time_model.error_median``, printed the same
    way) is a tie: it is within the typical error of one prediction, and on MaxText's published
    strategy comparisons most pairs the fit orders unlike the measurement were predicted that close
    (docs/time_model.md, "Strategy ranking"). Where either plan lies outside the fit's calibrated
    range the comparison is an extrapolation: the held-out error does not cover it, so it is no tie
    and no order either.

    Args:
      alt: the :class:`lcx.cost.Estimate` of the alternative plan.
      best: the :class:`lcx.cost.Estimate` of the recommendation.
      hw: their :class:`lcx.cost.Hardware`.
      seq_len: tokens per sequence.
      strategy: the alternative's context strategy.
      kernel: the alternative's attention kernel (None: ``xla``).
      best_strategy: the recommendation's context strategy.
      best_kernel: the recommendation's attention kernel (None: ``xla``).

    Returns:
      (the words, e.g. ``"+0.4%, a tie"``, ``"+3.1%, extrapolation: no error band"``, or
      ``"+3.0%, roofline"`` without a calibrated time model; whether the gap is a tie).
    """
    gap = round(100 * (alt.step_time / best.step_time - 1), 1) + 0.0  # + 0.0: no "-0.0"
    out = f"{gap:+.1f}%"
    tm = hw.time_model
    if tm is None or not alt.calibrated:
        return out + ", roofline", False
    if tm.calibrated is not None and (
        _outside(tm, alt, seq_len=seq_len, strategy=strategy, kernel=kernel)
        or _outside(tm, best, seq_len=seq_len, strategy=best_strategy, kernel=best_kernel)
    ):
        return out + ", extrapolation: no error band", False
    tie = tm.error_median is not None and abs(gap) < round(100 * tm.error_median, 1)
    return (out + ", a tie", True) if tie else (out, False)


def kind_lines(e: Any) -> list[str]:
    """One line per layer kind of estimate ``e`` (:attr:`lcx.cost.Estimate.kinds`): its layers,
    the strategy the plan gives it, its attention FLOPs and the bytes its strategy moves per
    device per step, and its attention seconds (compute plus exposed attention communication)."""
    out = []
    for k in e.kinds:
        span = f" (window {k.span:,})" if k.kind == "sliding" else f" (chunk {k.span:,})" if k.span else ""
        out.append(
            f"  {k.kind}{span} x{k.layers} layers: strategy {k.strategy}, attention {k.attention_flops:.3e} FLOP, "
            f"{_size(k.comm_bytes)} sent, {k.time:,.3f} s per device per step"
        )
    return out


def _size(n: float) -> str:
    """Bytes in GiB, or MiB below one GiB."""
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.2f} MiB"
