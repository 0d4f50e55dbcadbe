"""Generate docs/api.md, the API reference, from lcx's docstrings with :mod:`inspect`.

For each public package (its ``__init__`` re-exports are the public API) and a few public
modules, writes the module docstring, then every public class and function with its signature
and docstring, and each class's public methods and properties. Deterministic: rerun after
changing a docstring and commit the result.

    python experiments/gen_api_docs.py                 # writes docs/api.md
    python experiments/gen_api_docs.py --check         # exit 1 if docs/api.md is out of date

It documents the ``lcx`` that Python imports: in a working tree with other people's uncommitted
changes, render from a clean export of the commit instead, e.g.
``git archive HEAD | tar -x -C /tmp/lcx_head`` then
``PYTHONPATH=/tmp/lcx_head python /tmp/lcx_head/experiments/gen_api_docs.py --out docs/api.md``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODULES = (
    "lcx.sharding",
    "lcx.sharding.layout",
    "lcx.sharding.blocks",
    "lcx.attention",
    "lcx.attention.strategies",
    "lcx.attention.kernels",
    "lcx.models",
    "lcx.data",
    "lcx.data.stream",
    "lcx.data.sources",
    "lcx.data.passkey",
    "lcx.cost",
    "lcx.training",
    "lcx.training.state",
    "lcx.training.hooks",
    "lcx.training.checkpoint",
    "lcx.training.resume",
    "lcx.training.signals",
    "lcx.training.preflight",
    "lcx.training.runinfo",
    "lcx.config",
    "lcx.cli",
    "lcx.train",
    "lcx.plan",
)


def _sig(obj) -> str:
    try:
        s = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"
    return s if len(s) < 400 else s[:400] + " ...)"


def _doc(obj) -> str:
    d = inspect.getdoc(obj) or "*(no docstring)*"
    return d.strip()


def _public(mod) -> list[tuple[str, object]]:
    names = getattr(mod, "__all__", None) or [n for n in vars(mod) if not n.startswith("_")]
    out = []
    for n in names:
        obj = getattr(mod, n, None)
        owner = getattr(obj, "__module__", "") or ""
        if inspect.ismodule(obj) or not owner.startswith("lcx"):
            continue
        if inspect.isclass(obj) or inspect.isfunction(obj) or callable(obj):
            out.append((n, obj))
    return sorted(out, key=lambda t: (not inspect.isclass(t[1]), t[0].lower()))


def _members(cls) -> list[tuple[str, object]]:
    out = []
    for n, v in vars(cls).items():
        if n.startswith("_") or n in ("tree_flatten", "tree_unflatten"):
            continue
        if isinstance(v, property) or inspect.isfunction(v) or isinstance(v, (classmethod, staticmethod)):
            out.append((n, v))
    return out


def render() -> str:
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings by `python experiments/gen_api_docs.py`; do not edit by hand.",
        "Each package's `__init__` re-exports its public API.",
        "",
    ]
    lines += [f"- [`{m}`](#{m.replace('.', '')})" for m in MODULES] + [""]
    for name in MODULES:
        mod = importlib.import_module(name)
        lines += [f"## `{name}`", "", _doc(mod), ""]
        for n, obj in _public(mod):
            if getattr(obj, "__module__", "") != name and name in (
                "lcx.train",
                "lcx.plan",
                "lcx.sharding.layout",
                "lcx.data.passkey",
                "lcx.training.checkpoint",
                "lcx.training.runinfo",
            ):
                continue  # a module page lists what the module defines, not what it imports
            kind = "class" if inspect.isclass(obj) else "def"
            sig = (
                _sig(obj)
                if not inspect.isclass(obj) or "__init__" in vars(obj) or hasattr(obj, "__dataclass_fields__")
                else ""
            )
            lines += [f"### {kind} `{n}{sig}`", "", f"*{obj.__module__}*", "", _doc(obj), ""]
            if inspect.isclass(obj):
                for mn, mv in _members(obj):
                    f = mv.fget if isinstance(mv, property) else getattr(mv, "__func__", mv)
                    head = f"`{mn}` (property)" if isinstance(mv, property) else f"`{mn}{_sig(f)}`"
                    doc = (inspect.getdoc(f) or "").strip()
                    lines += [f"- {head}" + (": " + doc.replace("\n", "\n  ") if doc else "")]
                lines += [""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "api.md")
    ap.add_argument("--check", action="store_true", help="fail if the file differs from a fresh rendering")
    a = ap.parse_args(argv)
    text = render()
    if a.check:
        same = a.out.exists() and a.out.read_text() == text
        print("docs/api.md is up to date" if same else "docs/api.md is out of date: run experiments/gen_api_docs.py")
        return 0 if same else 1
    a.out.write_text(text)
    print(f"wrote {a.out} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
