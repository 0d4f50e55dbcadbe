"""CP greedy decoding against one device and teacher forcing: the numbers behind tests/test_generate.py.

Runs every case of ``tests/test_generate.py`` (``CP_CASES``, the splash-kernel case, and one
device) and records, per case: whether the greedy tokens equal one device's, the largest
difference of its logits from teacher forcing and from one device's decoding logits, over every
step, row and vocabulary entry. Writes ``experiments/results/generate_exactness.csv``;
``python experiments/report.py`` renders it into docs/generation.md.

    python experiments/generate_exactness.py      # ~2 minutes on 2 cores
"""

from __future__ import annotations

import os
import pathlib
import platform
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_default_matmul_precision", "highest")  # as tests/conftest.py

import numpy as np  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "experiments"))
sys.path.insert(0, str(ROOT / "tests"))
import _common as C  # noqa: E402
import test_generate as T  # noqa: E402  (the cases, the models and the helpers of the test)

from lcx.training.runinfo import git_commit  # noqa: E402


def main() -> None:
    cases = [(name, "single device", "-", "xla", "1 device") for name in T.MODELS]
    cases += [(n, s, layout, "xla", mesh) for n, s, layout, mesh in T.CP_CASES]
    cases += [("hybrid", T.HYBRID_HALO, "zigzag", "splash", "dp2-cp4")]
    rows = []
    for name, strategy, layout, kernel, mesh in cases:
        ref_toks, ref_logits, forced = T.reference(name)
        if strategy == "single device":
            toks, logits = ref_toks, ref_logits
        else:
            blocks = (128, 128) if kernel == "splash" else (8, 16)
            toks, logits = T.greedy(T.model(name), T.plan(strategy, layout, kernel=kernel, blocks=blocks, mesh=mesh))
        label = "ring + halo" if isinstance(strategy, dict) else strategy
        rows.append(
            {
                "model": name,
                "strategy": label,
                "layout": layout,
                "mesh": "usp 2x2 (+ data 2)" if strategy == "usp" else mesh,
                "kernel": kernel,
                "tokens_equal_one_device": bool(np.array_equal(toks, ref_toks)),
                "tokens_equal_teacher_argmax": bool(np.array_equal(toks, forced.argmax(-1))),
                "max_logit_err_vs_teacher": f"{np.abs(logits - forced).max():.2e}",
                "max_logit_err_vs_one_device": f"{np.abs(logits - ref_logits).max():.2e}",
            }
        )
        print(rows[-1], file=sys.stderr)
    commit = (git_commit() or "unrecorded")[:12]
    for r in rows:
        r |= {"git_commit": commit, "python": platform.python_version(), "jax": jax.__version__}
    print(f"wrote {C.rel(C.write_csv(rows, C.RESULTS / 'generate_exactness.csv'))}", file=sys.stderr)


if __name__ == "__main__":
    main()
