"""``tessera tune``: the tuning database from the command line.

- ``tessera tune FILE.py [args...]`` runs the script with ``TESSERA_TUNE=1``: every jitted function it
  calls is tuned on its first compile of a shape (a progress line with an ETA on stderr);
- ``--show`` prints the database as a table; ``--export F`` / ``--import F`` move its entries
  through a JSON file (a site-wide database for machines of one chip); ``--clear`` empties it.
"""
from __future__ import annotations

import os
import runpy
import sys

from tessera.runtime import tunedb


def table(entries: list[tunedb.Entry]) -> str:
    from tessera.frontend.tune import label
    head = ("family", "v", "dtype", "shape", "threads", "arch", "features", "pins", "best ms", "ok/tried")
    rows = [head]
    for e in entries:
        k = e.key
        ok = sum(t is not None for t in e.times.values())
        rows.append((k.family, str(k.version), k.dtype, "x".join(map(str, k.shape)), str(k.threads), k.arch, k.features,
                     label(e.pins), f"{e.best_ms:.4g}", f"{ok}/{len(e.times)}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def main(args) -> int:
    if args.file:
        os.environ["TESSERA_TUNE"] = "1"
        sys.argv = [args.file, *args.args]
        runpy.run_path(args.file, run_name="__main__")
    with tunedb.TuningDB() as db:
        if args.import_file:
            try:
                n = db.import_file(args.import_file)
            except (OSError, ValueError) as e:
                print(f"tessera tune --import: {e}", file=sys.stderr)
                return 1
            print(f"imported {n} entries from {args.import_file} into {db.path}")
        if args.export:
            print(f"exported {db.export(args.export)} entries from {db.path} to {args.export}")
        if args.clear:
            print(f"removed {db.clear()} entries from {db.path}")
        if args.show or not (args.file or args.import_file or args.export or args.clear):
            entries = db.entries()
            print(f"{db.path}: {len(entries)} entries")
            if entries:
                print(table(entries))
    return 0


def add_parser(sub) -> None:
    tp = sub.add_parser("tune", help="the tuning database: tune a script's jitted functions, --show, --export, "
                                     "--import, --clear")
    tp.add_argument("file", nargs="?", help="a Python script to run with TESSERA_TUNE=1")
    tp.add_argument("args", nargs="*", help="the script's arguments")
    tp.add_argument("--show", action="store_true", help="print the database as a table")
    tp.add_argument("--export", metavar="F", help="write every entry to the JSON file F")
    tp.add_argument("--import", dest="import_file", metavar="F", help="store every entry of the JSON file F")
    tp.add_argument("--clear", action="store_true", help="remove every entry")
    tp.set_defaults(func=main)
