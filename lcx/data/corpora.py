"""Corpora: lists of documents (str). The embedded default is the Python standard library.

:func:`stdlib_corpus` reads the ``.py`` source of CPython 3.11.7's standard library from a snapshot
shipped inside lcx (:data:`STDLIB_SNAPSHOT`): real, long, structured documents (734, one per
module file, 12,118,641 bytes), nothing downloaded, and the same bytes on every Python version lcx
runs on (the running interpreter's own library differs between 3.11 and 3.12, so the default run
would not be the same run on both). :func:`text_corpus` reads the user's own files, globs and
directories (``data=text`` and its presets ``data=jsonl|parquet|arrayrecord``) in any format of
:data:`lcx.data.readers.READERS`; a document is a file, a record, or a whole directory.

Every error raised here happens before anything compiles and names the path and the fix.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import os
import tarfile
from collections.abc import Iterator, Sequence

from lcx.data.paths import resolve_paths
from lcx.data.readers import AUTO, READERS, check_format, decode

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

DOCUMENTS: tuple[str, ...] = ("file", "directory")
"""What one document is (``data.document``): ``file``, a text file or one record of a record
file; ``directory``, the files of a directory in ``data.paths`` joined into one."""


def check_document(document: str) -> str:
    """``document`` if it is one of :data:`DOCUMENTS`.

    Raises:
      ValueError: another value, naming the valid ones.
    """
    if document not in DOCUMENTS:
        raise ValueError(f"unknown data.document {document!r}; use one of {', '.join(DOCUMENTS)}")
    return document


@dataclasses.dataclass(frozen=True)
class Corpus:
    """An ordered collection of documents.

    Behaves as a read-only sequence of the document strings (``len``, indexing, iteration).

    Attributes:
      documents: the document texts, in a deterministic order.
      names: one name per document, for messages: a path (relative to its root for the standard
        library), ``file:line`` for JSON-lines records, ``file[i]`` for rows and records of
        Parquet, Arrow and ArrayRecord files, the directory for ``data.document=directory``.
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
            docs.append(decode(fh.read(), path))
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
            docs.append(decode(data.read(), f"{STDLIB_SNAPSHOT}:{m.name}"))
    return Corpus(tuple(docs), tuple(m.name for m in members), f"lcx.data/{STDLIB_SNAPSHOT}")


def text_corpus(
    paths: Sequence[str] | str,
    *,
    text_field: str | None = "text",
    format: str = AUTO,
    document: str = "file",
    document_separator: str = "\n\n",
) -> Corpus:
    """The user's own text: files, globs and directories, in any format of
    :data:`lcx.data.readers.READERS`.

    Paths resolve as :mod:`lcx.data.paths` says (argument order, sorted within a glob or a
    directory, each file once; a directory's files recursively, those with a known suffix under
    ``format="auto"``). Each file is read by the reader of its format: a text file is one
    document, a JSON-lines line, Parquet or Arrow row, or ArrayRecord record is one document
    (its ``text_field``). With ``document="directory"`` each directory in ``paths`` (named or
    matched by a glob) is one document instead: its documents, in file order, joined by
    ``document_separator`` (empty ones left out); files named directly stay as with ``file``.
    Empty documents are kept here and skipped by packing (they hold no tokens).

    Args:
      paths: files, directories and/or glob patterns (a single string is one path).
      text_field: the field or column that holds the text (JSON lines, Parquet, Arrow,
        ArrayRecord JSON records); None reads ArrayRecord records as raw text.
      format: ``auto`` (by suffix) or a name in :data:`lcx.data.readers.READERS`, for every file.
      document: ``file`` or ``directory`` (:data:`DOCUMENTS`).
      document_separator: text between the files of a directory document.

    Returns:
      A :class:`Corpus` named as :attr:`Corpus.names` says.

    Raises:
      FileNotFoundError: a path that does not exist, a glob that matches nothing, a directory
        with no file to read.
      ValueError: no paths; an unknown ``format`` or ``document`` (names the known ones); a file
        that is not valid UTF-8 (file and byte offset; row or record); a JSON line that does not
        parse (``file:line``); a record without ``text_field`` (names the keys or columns it
        has) or whose value is not a string; a file that is not of its format; a corpus with no
        text at all.
    """
    if isinstance(paths, str):
        paths = [paths]
    paths = list(paths)
    if not paths:
        raise ValueError("data.paths needs at least one path, e.g. data.paths=[a.txt,'docs/*.md']")
    check_format(format)
    check_document(document)
    docs: list[str] = []
    names: list[str] = []
    for match in resolve_paths(paths, format):
        read = (d for path, fmt in match.files for d in READERS[fmt].read(path, text_field))
        if document == "directory" and match.directory:
            if match.files:  # a directory whose files all came earlier gives no document
                docs.append(document_separator.join(d.text for d in read if d.text))
                names.append(match.name)
            continue
        for d in read:
            docs.append(d.text)
            names.append(d.where)
    if not any(docs):
        raise ValueError(
            f"the corpus from data.paths={paths} is empty ({len(docs)} documents, 0 characters); "
            f"point data.paths at files that contain text"
        )
    return Corpus(tuple(docs), tuple(names), ",".join(paths))
