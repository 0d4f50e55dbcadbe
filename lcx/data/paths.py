"""``data.paths``: files, globs and directories, resolved to the files to read and their formats.

Rules (docs/configs.md, "Your own text"):

- entries are taken in the order given; the files of a glob or a directory in sorted order of
  their path (a glob's ``**`` recurses); each file is read once, however many entries name it
  (compared by real path);
- a file (named, or matched by a glob) is read as ``data.format``, or by its suffix under
  ``auto`` (:func:`lcx.data.readers.format_of`: an unknown suffix reads as plain text);
- a directory (named, or matched by a glob) gives its files, recursively, skipping names that
  start with ``.`` (``.git``, editor and checksum files): under ``data.format=auto`` those with a
  known suffix (:data:`lcx.data.readers.READERS`), under a set format all of them.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Sequence

from lcx.data.readers import AUTO, READERS, check_format, format_of, suffix_format


@dataclasses.dataclass(frozen=True)
class PathMatch:
    """The files one ``data.paths`` match stands for.

    Attributes:
      name: the file or directory, as given or as matched.
      files: ``(path, format)`` of each file to read, in reading order.
      directory: ``name`` is a directory (its files may form one document,
        ``data.document=directory``).
    """

    name: str
    files: tuple[tuple[str, str], ...]
    directory: bool


def _walk(root: str, fmt: str) -> list[str]:
    """Files under the directory ``root`` the rules keep, sorted by path.

    Raises:
      FileNotFoundError: none is kept (names the directory and the known suffixes).
    """
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for f in filenames:
            if not f.startswith(".") and (fmt != AUTO or suffix_format(f) is not None):
                found.append(os.path.join(dirpath, f))
    if not found:
        known = "; ".join(
            f"{n}: {' '.join(r.suffixes[:4])}{' ...' * (len(r.suffixes) > 4)}" for n, r in READERS.items()
        )
        which = (
            "no file (names starting with '.' are skipped)" if fmt != AUTO else f"no file with a known suffix ({known})"
        )
        raise FileNotFoundError(
            f"directory {root!r} holds {which}; point data.paths at the files, or set data.format "
            f"(e.g. data.format=text) to read every file in it as that format"
        )
    return sorted(found)


def _matches(entry: str) -> list[str]:
    """The files and directories ``entry`` (a path or a glob) names, sorted.

    Raises:
      FileNotFoundError: a path that does not exist, a glob that matches nothing.
    """
    if glob.has_magic(entry):
        matches = sorted(m for m in glob.glob(entry, recursive=True) if os.path.isfile(m) or os.path.isdir(m))
        if not matches:
            raise FileNotFoundError(
                f"glob {entry!r} matched no file (working directory {os.getcwd()!r}); check the "
                f"pattern, or use '**' with a quoted glob for subdirectories, e.g. 'docs/**/*.md'"
            )
        return matches
    if not (os.path.isfile(entry) or os.path.isdir(entry)):
        raise FileNotFoundError(
            f"data path {entry!r} not found (working directory {os.getcwd()!r}); check data.paths, or use an absolute path"
        )
    return [entry]


def resolve_paths(paths: Sequence[str], fmt: str = AUTO) -> list[PathMatch]:
    """The sources ``paths`` names, each file once, in the order of the rules above.

    Args:
      paths: files, directories and/or glob patterns (``~`` expanded).
      fmt: ``data.format``: ``auto`` or a name in :data:`lcx.data.readers.READERS`.

    Returns:
      One :class:`PathMatch` per file or directory matched; a directory whose files all came
      earlier has none.

    Raises:
      FileNotFoundError: a path that does not exist; a glob that matches nothing; a directory
        with no file to read.
      ValueError: an unknown ``fmt``.
    """
    check_format(fmt)  # an unknown format is refused before any path is looked at
    seen: set[str] = set()
    matches = []
    for entry in paths:
        for m in _matches(os.path.expanduser(str(entry))):
            directory = os.path.isdir(m)
            files = []
            for f in _walk(m, fmt) if directory else [m]:
                key = os.path.realpath(f)
                if key not in seen:  # overlapping entries: each file once
                    seen.add(key)
                    files.append((f, format_of(f, fmt)))
            matches.append(PathMatch(m, tuple(files), directory))
    return matches


__all__ = ["PathMatch", "resolve_paths"]
