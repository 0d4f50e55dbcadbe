"""The report of ``python -m lcx.eval``: passkey / needle-in-a-haystack retrieval of a checkpoint.

:func:`run_eval` evaluates a checkpoint (:mod:`lcx.training.retrieval`) across context lengths
and key depths, with the checkpoint's own model (RoPE scaling included) and plan, and writes
``eval.json`` (settings, one result per (length, depth), exact match per length) and
``passkey_heatmap.png``.
"""

from __future__ import annotations

import json
import pathlib

from lcx.reports.config import EvalQuery


def check_byte_level(run: dict, ckpt) -> None:
    """Refuse a checkpoint trained with another tokenizer than ``byte``: the teacher-forced
    pass key rows are bytes (:mod:`lcx.data.passkey`), which such a model would read as other
    tokens, scoring noise.

    Args:
      run: the checkpoint's run record (``data.tokenizer``; absent: ``byte``); ckpt: its
        directory, for the message.

    Raises:
      ValueError: ``data.tokenizer`` is not ``byte``; names it and the command that scores the
        pass key by generation in the checkpoint's own tokenizer.
    """
    tok = (run.get("data") or {}).get("tokenizer", "byte")
    if tok != "byte":
        raise ValueError(
            f"eval=passkey reads byte-level rows (lcx.data.passkey), but checkpoint {ckpt} was trained with "
            f"data.tokenizer={tok!r}, whose ids mean other text; score the pass key by generation in the "
            f"checkpoint's own tokenizer: python -m lcx.eval eval=ruler eval.tasks=[passkey] checkpoint.dir={ckpt}"
        )


def run_eval(query: EvalQuery, out_dir: str | pathlib.Path, devices) -> dict:
    """Evaluate the checkpoint ``query.checkpoint`` names as ``query.eval`` says; write
    ``eval.json`` and the heatmap.

    Raises:
      FileNotFoundError: no checkpoint there. ValueError / PlanError: a length the task or the
        plan cannot serve; a checkpoint whose tokenizer is not ``byte`` (:func:`check_byte_level`,
        before the model is loaded).
    """
    from lcx.sharding import bind
    from lcx.sharding.config import plan_from_dict
    from lcx.training.resume import checkpoint_run, load_model
    from lcx.training.retrieval import grid, passkey_grid, write_heatmap

    ckpt, e, hw = query.checkpoint.dir, query.eval, query.hardware
    step, run = checkpoint_run(ckpt, query.checkpoint.step)
    check_byte_level(run, ckpt)
    # a checkpoint stores its plan as a mapping; null blocks and kernel: this hardware's
    plan = plan_from_dict(run["plan"], default_block=hw.attention_block, default_kernel=hw.attention_kernel)
    mp = bind(plan, devices)
    model, meta = load_model(ckpt, mp, step=step, rope=query.eval.rope)
    S = int(run["train"]["seq_len"])
    lengths = list(e.lengths) if e.lengths is not None else [S // 2, S, 2 * S]
    digits = e.digits if e.digits is not None else int((run.get("data") or {}).get("digits", 5))
    batch = e.global_batch if e.global_batch is not None else int(run["train"]["global_batch"])
    results = passkey_grid(
        model,
        mp,
        lengths=lengths,
        depths=list(e.depths),
        per_depth=e.per_depth,
        global_batch=batch,
        digits=digits,
        seed=e.seed,
        vocab_tiling=int((run.get("memory") or {}).get("vocab_tiling", 1)),
    )
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lens, _, v = grid(results)
    report = {
        "task": "passkey",
        "checkpoint": str(ckpt),
        "step": int(meta["step"]),
        "model": run["model"],
        "plan": plan.name,
        "train_seq_len": S,
        "lengths": lengths,
        "depths": [float(d) for d in e.depths],
        "per_depth": e.per_depth,
        "digits": digits,
        "seed": e.seed,
        "exact_match_by_length": {str(s): float(v[:, j].mean()) for j, s in enumerate(lens)},
        "results": results,
    }
    (out_dir / "eval.json").write_text(json.dumps(report, indent=2))
    report["heatmap_writer"] = write_heatmap(
        results, out_dir / "passkey_heatmap.png", title=f"passkey, {run['model']['name']} step {meta['step']}"
    )
    return report
