"""File formats of a corpus: one reader per format, registered in :data:`READERS`.

A reader turns one file into :class:`Document` s (the text and where it came from: ``file``,
``file:line`` or ``file[row]``). The format of a file is ``data.format`` when set, else its
suffix (:func:`format_of`). Adding a format is one :class:`Reader` subclass and one line in
:data:`READERS`. pyarrow and array_record are imported by the readers that need them, when a
file of theirs is read.

Every error names the file and the place in it (line, byte offset, row or record) and says what
to change; nothing is skipped or replaced silently.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Iterator
from typing import Any, ClassVar, NamedTuple, final

FIELD_HINT = "set data.text_field to the field that holds the text"


class Document(NamedTuple):
    """One document and where it came from.

    Attributes:
      text: the document's text.
      where: ``file`` (a text file), ``file:line`` (a JSON-lines record, lines counted from 1) or
        ``file[i]`` (row or record ``i`` of a Parquet, Arrow or ArrayRecord file, counted from 0).
    """

    text: str
    where: str


def decode(data: bytes, where: str, base_offset: int = 0, within: str = "") -> str:
    """``data`` decoded as UTF-8, strictly.

    Args:
      data: the bytes.
      where: the file (or ``file:line``, ``file[i]``) for the message.
      base_offset: byte offset of ``data`` in the file.
      within: what the offset counts in, for the message (e.g. ``" of the record"``).

    Raises:
      ValueError: invalid UTF-8, naming ``where`` and the byte offset.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{where}: not valid UTF-8 at byte offset {base_offset + e.start}{within} ({e.reason}); lcx reads "
            f"text as UTF-8 and never replaces bytes silently. Convert the file (for example "
            f"`iconv -f latin1 -t utf-8`) or leave it out of data.paths"
        ) from None


def _need_field(text_field: str | None, path: str) -> str:
    if text_field is None:
        raise ValueError(
            f"{path}: data.text_field is null, which only ArrayRecord files of raw text accept; {FIELD_HINT}"
        )
    return text_field


def record_text(record: Any, text_field: str, where: str) -> str:
    """The text of one JSON record: its string field ``text_field``.

    Raises:
      ValueError: ``record`` is not an object or lacks the field (names the keys it has), or the
        field is not a string.
    """
    if not isinstance(record, dict) or text_field not in record:
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"{where}: record has no field {text_field!r} (found {keys}); {FIELD_HINT}")
    value = record[text_field]
    if not isinstance(value, str):
        raise ValueError(f"{where}: field {text_field!r} is a {type(value).__name__}, not a string")
    return value


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None


class Reader(abc.ABC):
    """Reads one file of a format into documents.

    Attributes:
      suffixes: the file-name suffixes (lower case, with the dot) that pick this format under
        ``data.format=auto``.
    """

    suffixes: ClassVar[tuple[str, ...]]

    @abc.abstractmethod
    def read(self, path: str, text_field: str | None) -> Iterator[Document]:
        """The documents of the file ``path``, in file order.

        Args:
          path: an existing file.
          text_field: the field or column holding the text (None: ArrayRecord raw text only).

        Raises:
          ValueError: the file's content is not of this format or not text; the message names
            the file and the place in it.
        """


@final
class TextReader(Reader):
    """UTF-8 plain text: the whole file is one document."""

    suffixes = (
        *(".txt", ".text", ".md", ".markdown", ".rst", ".adoc", ".org", ".tex", ".html", ".htm", ".xml"),
        *(".py", ".pyi", ".ipynb", ".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".cu", ".cuh"),
        *(".rs", ".go", ".java", ".kt", ".scala", ".swift", ".m", ".mm", ".cs", ".fs", ".js", ".mjs"),
        *(".ts", ".jsx", ".tsx", ".rb", ".php", ".pl", ".lua", ".r", ".jl", ".hs", ".ml", ".mli"),
        *(".ex", ".exs", ".erl", ".clj", ".dart", ".zig", ".nim", ".f90", ".s", ".asm", ".sql"),
        *(".sh", ".bash", ".zsh", ".css", ".scss", ".yaml", ".yml", ".toml", ".ini", ".cfg"),
        *(".cmake", ".proto", ".v", ".sv", ".vhd"),
    )

    def read(self, path: str, text_field: str | None) -> Iterator[Document]:
        with open(path, "rb") as fh:
            yield Document(decode(fh.read(), path), path)


@final
class JsonlReader(Reader):
    """JSON lines: one document per non-blank line, the string field ``text_field`` of a JSON
    object. Errors name ``file:line`` (and the byte offset in the file for invalid UTF-8)."""

    suffixes = (".jsonl", ".ndjson")

    def read(self, path: str, text_field: str | None) -> Iterator[Document]:
        field = _need_field(text_field, path)
        offset = 0
        with open(path, "rb") as fh:
            for lineno, line in enumerate(fh, start=1):
                where = f"{path}:{lineno}"
                text = decode(line, where, offset)
                offset += len(line)
                if text.strip():  # blank lines (a trailing newline, say) hold no record
                    yield Document(record_text(_json(text, where), field, where), where)


_ARROW_TEXT = {"string": False, "large_string": False, "string_view": False}
_ARROW_TEXT |= {"binary": True, "large_binary": True, "binary_view": True}
"""The Arrow types a text column may have: is it binary (UTF-8 bytes decoded here)?"""


def _text_column(schema: Any, path: str, text_field: str | None) -> int:
    """Index of the string (or binary) column ``text_field`` in an Arrow ``schema``.

    Raises:
      ValueError: no such column (names the columns there), or one of another type.
    """
    field = _need_field(text_field, path)
    if field not in schema.names:
        raise ValueError(f"{path}: no column {field!r} (columns: {schema.names}); {FIELD_HINT}")
    i = schema.get_field_index(field)
    if str(schema.field(i).type) not in _ARROW_TEXT:
        raise ValueError(f"{path}: column {field!r} holds {schema.field(i).type}, not strings; {FIELD_HINT}")
    return i


def _column_documents(column: Any, path: str, first_row: int, field: str) -> Iterator[Document]:
    """The documents of one Arrow column chunk (string or binary), rows from ``first_row``."""
    import pyarrow as pa

    binary = _ARROW_TEXT[str(column.type)]
    try:
        values = column.to_pylist()
    except UnicodeDecodeError:  # a string column holding invalid UTF-8: find the row below
        values, binary = column.cast(pa.large_binary()).to_pylist(), True
    for i, value in enumerate(values):
        where = f"{path}[{first_row + i}]"
        if value is None:
            raise ValueError(f"{where}: column {field!r} is null, not a string")
        yield Document(decode(value, where, within=" of the value") if binary else value, where)


@final
class ParquetReader(Reader):
    """Parquet: one document per row, from the string (or binary UTF-8) column ``text_field``;
    only that column is read, one record batch at a time. Rows are counted from 0."""

    suffixes = (".parquet", ".pq")

    def read(self, path: str, text_field: str | None) -> Iterator[Document]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
        except (pa.ArrowInvalid, OSError) as e:
            raise ValueError(f"{path}: not a Parquet file (pyarrow: {e})") from None
        schema = pf.schema_arrow
        i = _text_column(schema, path, text_field)
        row = 0
        for batch in pf.iter_batches(batch_size=1024, columns=[schema.names[i]]):
            yield from _column_documents(batch.column(0), path, row, schema.names[i])
            row += batch.num_rows


@final
class ArrowReader(Reader):
    """Arrow IPC, file (Feather v2) or stream format (as Hugging Face ``datasets`` caches are): one
    document per row of the string (or binary UTF-8) column ``text_field``, memory-mapped, one
    record batch at a time, only that column decoded. Rows are counted from 0."""

    suffixes = (".arrow", ".feather", ".ipc")

    def read(self, path: str, text_field: str | None) -> Iterator[Document]:
        import pyarrow as pa
        import pyarrow.ipc as ipc

        with pa.memory_map(path) as source:
            try:
                field, batches = self._open(source, ipc.open_file, path, text_field)
            except pa.ArrowInvalid as file_error:
                try:
                    field, batches = self._open(source, ipc.open_stream, path, text_field)
                except pa.ArrowInvalid as e:
                    raise ValueError(
                        f"{path}: not an Arrow IPC file or stream (pyarrow: {file_error}; {e}); Feather v1 "
                        f"files are not read: rewrite them with pyarrow.feather.write_feather"
                    ) from None
            row = 0
            for batch in batches:
                yield from _column_documents(batch.column(0), path, row, field)
                row += batch.num_rows

    @staticmethod
    def _open(source: Any, opener: Any, path: str, text_field: str | None) -> tuple[str, Iterator[Any]]:
        """(the text column's name, its record batches) of ``source`` opened by ``opener``."""
        import pyarrow.ipc as ipc

        source.seek(0)
        schema = opener(source).schema
        i = _text_column(schema, path, text_field)
        source.seek(0)
        reader = opener(source, options=ipc.IpcReadOptions(included_fields=[i]))
        if hasattr(reader, "get_batch"):  # the file format: random access
            return schema.names[i], (reader.get_batch(k) for k in range(reader.num_record_batches))
        return schema.names[i], iter(reader)


@final
class ArrayRecordReader(Reader):
    """ArrayRecord: one document per record, records counted from 0. A file whose first record
    is a JSON object (starts with ``{``) holds JSON records: each document is the string field
    ``text_field``; any other file holds raw UTF-8 text, one document per record.
    ``data.text_field=null`` reads every file as raw text (a corpus of JSON documents, say)."""

    suffixes = (".array_record", ".arrayrecord")
    chunk: ClassVar[int] = 1024  # records read per call

    def read(self, path: str, text_field: str | None) -> Iterator[Document]:
        try:
            from array_record.python.array_record_module import ArrayRecordReader as Native
        except ImportError:  # pragma: no cover - a dependency of lcx
            raise ImportError(
                f"{path}: reading ArrayRecord files needs array_record: pip install array-record"
            ) from None

        reader = Native(path)
        if not reader.ok():
            why = "empty, truncated or of another format"
            try:
                reader.close()  # a reader that failed says why when it is closed
            except RuntimeError as e:
                why = str(e)
            raise ValueError(f"{path}: not a readable ArrayRecord file ({why})")
        try:
            n = reader.num_records()
            field = text_field  # JSON records: their field; None: raw text (decided by record 0)
            for start in range(0, n, self.chunk):
                for k, data in enumerate(reader.read(start, min(n, start + self.chunk)), start=start):
                    where = f"{path}[{k}]"
                    text = decode(data, where, within=" of the record")
                    if k == 0 and not text.lstrip().startswith("{"):
                        field = None
                    yield Document(text if field is None else record_text(_json(text, where), field, where), where)
        finally:
            reader.close()


READERS: dict[str, Reader] = {
    "text": TextReader(),  # UTF-8 plain text, one document per file
    "jsonl": JsonlReader(),  # JSON lines, one document per record
    "parquet": ParquetReader(),  # Parquet, one document per row of the text column
    "arrow": ArrowReader(),  # Arrow IPC file or stream (Feather v2, datasets caches)
    "arrayrecord": ArrayRecordReader(),  # ArrayRecord, JSON or raw-text records
}
"""Every format ``data.format`` can name (besides ``auto``), by name."""

AUTO = "auto"


def check_format(fmt: str) -> str:
    """``fmt`` if it names a format (or ``auto``).

    Raises:
      ValueError: an unknown format, naming the known ones.
    """
    if fmt != AUTO and fmt not in READERS:
        raise ValueError(f"unknown data.format {fmt!r}; use one of {AUTO}, {', '.join(READERS)}")
    return fmt


def suffix_format(path: str) -> str | None:
    """The format whose suffix ``path`` has (case-insensitive), or None."""
    name = path.lower()
    return next((f for f, r in READERS.items() if name.endswith(r.suffixes)), None)


def format_of(path: str, fmt: str = AUTO) -> str:
    """The format to read ``path`` as: ``fmt`` when set, else by suffix, else plain text.

    Raises:
      ValueError: an unknown ``fmt``.
    """
    if check_format(fmt) != AUTO:
        return fmt
    return suffix_format(path) or "text"


__all__ = [
    "AUTO",
    "ArrayRecordReader",
    "ArrowReader",
    "Document",
    "JsonlReader",
    "ParquetReader",
    "READERS",
    "Reader",
    "TextReader",
    "check_format",
    "decode",
    "format_of",
    "record_text",
    "suffix_format",
]
