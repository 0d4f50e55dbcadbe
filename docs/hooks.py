"""mkdocs hook: publish the experiments' plots, which live outside docs/, with the site.

The pages link the plots where they are in the repository (``../experiments/results/<name>.png``),
so the links also work when the Markdown is read on its own. mkdocs only publishes files under
``docs_dir``, so this hook adds ``experiments/results/*.png`` to the site as ``results/<name>.png``
and points each page's links there. Registered under ``hooks:`` in mkdocs.yml.
"""

from __future__ import annotations

import pathlib
import re

from mkdocs.structure.files import File

EXPERIMENTS = pathlib.Path(__file__).resolve().parent.parent / "experiments"
_LINK = re.compile(r"\]\(((?:\.\./)+)experiments/results/")


def on_files(files, config):
    """Add each ``experiments/results/*.png`` to the site as ``results/<name>.png``."""
    for png in sorted((EXPERIMENTS / "results").glob("*.png")):
        files.append(File(f"results/{png.name}", str(EXPERIMENTS), config["site_dir"], config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    """Point ``../experiments/results/`` links at the published ``results/`` copies.

    A page one level below the repository root (docs/X.md) reaches ``experiments/`` with one more
    ``../`` than it reaches the site root, so one ``../`` is dropped.
    """
    return _LINK.sub(lambda m: "](" + m.group(1)[3:] + "results/", markdown)
