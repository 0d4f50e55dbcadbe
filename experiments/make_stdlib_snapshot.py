"""Generate lcx/data/stdlib-3.11.7.tar.xz: the embedded default corpus (``data=stdlib``).

The default run must read the same bytes on every supported stack: the standard library of the
interpreter that runs lcx differs between Python 3.11 and 3.12 (and between patch releases), so
lcx ships one fixed snapshot of it instead of reading the running interpreter's. This script
made it, once, from CPython 3.11.7's ``lib/python3.11`` (the ``.py`` files that
:func:`lcx.data.corpora.stdlib_corpus` reads from a directory: test suites, site-packages and
caches skipped; 734 documents, 12,118,641 bytes), with CPython's ``LICENSE.txt`` (the PSF
license, under which the source is redistributed) beside it:

    python3.11 experiments/make_stdlib_snapshot.py                      # the running 3.11.7
    python experiments/make_stdlib_snapshot.py --root DIR --version X.Y.Z --out lcx/data

The archive is a POSIX tar (Python's ``tarfile``) compressed with xz (preset 9), one member per
document named by its path relative to the standard library root, sorted; every member has
mtime 0, mode 0644 and uid/gid 0, so the same input gives the same bytes. Run it only to change
the snapshot: every committed result that used ``data=stdlib`` would change with it.
"""

from __future__ import annotations

import argparse
import io
import pathlib
import platform
import shutil
import sysconfig
import tarfile

from lcx.data.corpora import stdlib_corpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=sysconfig.get_paths()["stdlib"], help="standard library directory to read")
    ap.add_argument("--version", default=platform.python_version(), help="its CPython version (in the file name)")
    ap.add_argument("--out", default="lcx/data", help="directory to write the archive and its license into")
    args = ap.parse_args()
    corpus = stdlib_corpus(args.root)
    out = pathlib.Path(args.out)
    archive = out / f"stdlib-{args.version}.tar.xz"
    with tarfile.open(archive, "w:xz", preset=9, format=tarfile.PAX_FORMAT) as tf:
        for name, doc in sorted(zip(corpus.names, corpus.documents)):
            data = doc.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tf.addfile(info, io.BytesIO(data))
    shutil.copyfile(pathlib.Path(args.root) / "LICENSE.txt", out / f"stdlib-{args.version}-LICENSE.txt")
    print(f"{archive}: {len(corpus)} documents, {corpus.num_bytes:,} bytes -> {archive.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
