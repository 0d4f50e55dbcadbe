"""Corpora: lists of documents (str). The embedded default is the Python standard library.

:func:`stdlib_corpus` reads the ``.py`` source of CPython 3.11.7's standard library from a snapshot
shipped inside lcx (:data:`STDLIB_SNAPSHOT`): real, long, structured documents (734, one per
module file, 12,118,641 bytes), nothing downloaded, and the same bytes on every Python version lcx
runs on (the running interpreter's own library differs between 3.11 and 3.12, so the default run
would not be the same run on both). :func:`text_corpus` reads the user's own files and globs
(``data=text``).

Every error raised here happens before anything compiles and names the path and the fix.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import importlib.resources
import json
import os
import tarfile
from collections.abc import Iterator, Sequence

# Directories skipped in the standard library: installed third-party packages (site-packages,
# dist-packages: not part of the stdlib, and their size varies per machine), CPython's own test
# suite (test/, tests/, idle_test/: ~17 MB of test code and fixture files, some deliberately in
# non-UTF-8 encodings) and bytecode caches.
STDLIB_SKIP_DIRS: frozenset[str] = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
)

STDLIB_SNAPSHOT: str = "stdlib-3.11.7.tar.xz"
"""The embedded default corpus, a file of the package ``lcx.data``: CPython 3.11.7's standard
library (the ``.py`` files :func:`stdlib_corpus` reads from a directory), one tar member per
document named by its relative path, xz-compressed (2.0 MB); its license (PSF) is
``stdlib-3.11.7-LICENSE.txt`` beside it. Made by ``experiments/make_stdlib_snapshot.py``."""

# Suffixes read as JSON lines (one document per line, from a text field); any other file is plain
# text, one document per file.
JSONL_SUFFIXES: tuple[str, ...] = (".jsonl", ".ndjson")


@dataclasses.dataclass(frozen=True)
class Corpus:
    """An ordered collection of documents.

    Behaves as a read-only sequence of the document strings (``len``, indexing, iteration).

    Attributes:
      documents: the document texts, in a deterministic order.
      names: one name per document, for messages: a path relative to its root, or ``file:line``
        for JSON-lines records.
      source: where the corpus came from (a directory, or the user's path arguments).
    """

    documents: tuple[str, ...]
    names: tuple[str, ...]
    source: str

    def __post_init__(self):
        if len(self.documents) != len(self.names):
            raise ValueError(
                f"Corpus needs one name per document, got {len(self.documents)} documents and {len(self.names)} names"
            )

    def __len__(self) -> int:
        return len(self.documents)

    def __getitem__(self, i):
        return self.documents[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self.documents)

    @property
    def num_bytes(self) -> int:
        """Total size in UTF-8 bytes (= tokens under the byte tokenizer)."""
        return sum(len(d.encode("utf-8")) for d in self.documents)


def _decode(data: bytes, path: str, base_offset: int = 0) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path}: not valid UTF-8 at byte offset {base_offset + e.start} ({e.reason}); lcx reads "
            f"text as UTF-8 and never replaces bytes silently. Convert the file (for example "
            f"`iconv -f latin1 -t utf-8`) or leave it out of data.paths"
        ) from None


@functools.lru_cache(maxsize=2)
def stdlib_corpus(root: str | None = None) -> Corpus:
    """Python standard library source, one document per ``.py`` file, sorted by relative path.

    With no ``root``: the embedded snapshot of CPython 3.11.7's standard library
    (:data:`STDLIB_SNAPSHOT`; 734 documents, 12,118,641 bytes, from a few bytes to about 0.75 MB
    each), identical on every Python version. With ``root``: the ``.py`` files under that
    directory (for example ``sysconfig.get_paths()["stdlib"]``, the running interpreter's own),
    skipping the directories in :data:`STDLIB_SKIP_DIRS` (third-party packages, CPython's test
    suite, caches). The result is cached.

    Args:
      root: directory to read; None: the embedded snapshot.

    Returns:
      A :class:`Corpus` whose names are paths relative to the standard library root.

    Raises:
      FileNotFoundError: ``root`` is not a directory.
      ValueError: no ``.py`` file found, or a file is not valid UTF-8 (path and byte offset).
    """
    if root is None:
        return _snapshot_corpus()
    if not os.path.isdir(root):
        raise FileNotFoundError(f"standard library directory {root!r} not found; use data=text with your own files")
    rels = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in STDLIB_SKIP_DIRS]
        for f in filenames:
            if f.endswith(".py"):
                rels.append(os.path.relpath(os.path.join(dirpath, f), root))
    rels.sort()
    docs = []
    for rel in rels:
        path = os.path.join(root, rel)
        with open(path, "rb") as fh:
            docs.append(_decode(fh.read(), path))
    if not any(docs):
        raise ValueError(f"no Python source found under {root!r}; use data=text with your own files")
    return Corpus(tuple(docs), tuple(rels), root)


def _snapshot_corpus() -> Corpus:
    """The embedded :data:`STDLIB_SNAPSHOT`, read with ``tarfile`` (about 0.6 s)."""
    source = importlib.resources.files("lcx.data") / STDLIB_SNAPSHOT
    with source.open("rb") as fh, tarfile.open(fileobj=fh, mode="r:xz") as tf:
        members = sorted((m for m in tf.getmembers() if m.isfile()), key=lambda m: m.name)
        docs = []
        for m in members:
            data = tf.extractfile(m)
            assert data is not None  # a regular file always has contents
            docs.append(_decode(data.read(), f"{STDLIB_SNAPSHOT}:{m.name}"))
    return Corpus(tuple(docs), tuple(m.name for m in members), f"lcx.data/{STDLIB_SNAPSHOT}")


def _expand(paths: Sequence[str]) -> list[str]:
    """Files named by ``paths`` (files or globs), in argument order, sorted within each glob."""
    files: list[str] = []
    seen: set[str] = set()
    for p in paths:
        p = os.path.expanduser(str(p))
        if glob.has_magic(p):
            matches = sorted(m for m in glob.glob(p, recursive=True) if os.path.isfile(m))
            if not matches:
                raise FileNotFoundError(
                    f"glob {p!r} matched no file (working directory {os.getcwd()!r}); check the "
                    f"pattern, or use '**' with a quoted glob for subdirectories, e.g. 'docs/**/*.md'"
                )
        elif os.path.isdir(p):
            raise ValueError(
                f"{p!r} is a directory; give files or a quoted glob instead, e.g. '{p.rstrip('/')}/**/*.txt'"
            )
        elif not os.path.isfile(p):
            raise FileNotFoundError(
                f"data path {p!r} not found (working directory {os.getcwd()!r}); check "
                f"data.paths, or use an absolute path"
            )
        else:
            matches = [p]
        for m in matches:
            key = os.path.realpath(m)
            if key not in seen:  # overlapping globs: each file once
                seen.add(key)
                files.append(m)
    return files


def _read_jsonl(path: str, text_field: str) -> tuple[list[str], list[str]]:
    with open(path, "rb") as fh:
        raw = fh.read()
    docs, names = [], []
    offset = 0
    for lineno, line in enumerate(raw.split(b"\n"), start=1):
        text = _decode(line, f"{path}:{lineno}", offset)
        offset += len(line) + 1
        if not text.strip():
            continue  # blank lines (for example a trailing newline) hold no record
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(record, dict) or text_field not in record:
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(
                f"{path}:{lineno}: record has no field {text_field!r} (found {keys}); set "
                f"data.text_field to the field that holds the text"
            )
        value = record[text_field]
        if not isinstance(value, str):
            raise ValueError(f"{path}:{lineno}: field {text_field!r} is a {type(value).__name__}, not a string")
        docs.append(value)
        names.append(f"{path}:{lineno}")
    return docs, names


def text_corpus(paths: Sequence[str] | str, *, text_field: str = "text") -> Corpus:
    """The user's own text: files or globs, plain text or JSON lines.

    A ``.jsonl``/``.ndjson`` file gives one document per non-blank line, from the string field
    ``text_field`` of each JSON object; any other file is UTF-8 plain text, one document per file.
    Files come in argument order, sorted within each glob (``**`` recurses), each file once.
    Empty documents are kept here and skipped by packing (they hold no tokens).

    Args:
      paths: file paths and/or glob patterns (a single string is one path).
      text_field: JSON field holding the text in JSON-lines files.

    Returns:
      A :class:`Corpus` whose names are file paths, or ``file:line`` for JSON-lines records.

    Raises:
      FileNotFoundError: a path that does not exist, or a glob that matches no file.
      ValueError: no paths; a directory given as a path; a file that is not valid UTF-8 (path
        and byte offset); a JSON-lines line that is not valid JSON or lacks ``text_field``
        (``file:line``); a corpus with no text at all.
    """
    if isinstance(paths, str):
        paths = [paths]
    paths = list(paths)
    if not paths:
        raise ValueError("data=text needs at least one path, e.g. data.paths=[a.txt,'docs/*.md']")
    docs: list[str] = []
    names: list[str] = []
    for f in _expand(paths):
        if f.lower().endswith(JSONL_SUFFIXES):
            d, n = _read_jsonl(f, text_field)
        else:
            with open(f, "rb") as fh:
                d, n = [_decode(fh.read(), f)], [f]
        docs += d
        names += n
    if not any(docs):
        raise ValueError(
            f"the corpus from data.paths={paths} is empty ({len(docs)} documents, 0 characters); "
            f"point data.paths at files that contain text"
        )
    return Corpus(tuple(docs), tuple(names), ",".join(paths))
