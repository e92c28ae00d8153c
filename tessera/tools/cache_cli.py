"""``tessera cache info | ls | clear | prune``: the compile cache on disk (runtime/cache_admin.py)."""
from __future__ import annotations

import time


def human(n: int | None) -> str:
    if n is None:
        return "no cap"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"   # pragma: no cover


def _age(seconds: float) -> str:
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f}{unit}"
    return f"{max(seconds, 0):.0f}s"


def add_parser(sub) -> None:
    c = sub.add_parser("cache", help="the compile cache: info, ls (list), clear, prune")
    c.add_argument("action", choices=["info", "ls", "list", "clear", "prune"])
    c.add_argument("--tuning", action="store_true", help="clear: also remove the tuning database (tuning/)")
    c.add_argument("--repro", action="store_true", help="clear: also remove compiler-failure reproducers (repro/)")
    c.add_argument("--max-size", default=None,
                   help="prune: evict least recently used entries down to this size (512M, 2G; default the cap)")
    c.set_defaults(func=run)


def run(args) -> int:
    from tessera.runtime import cache, cache_admin
    if args.action == "info":
        i = cache_admin.info()
        print(f"dir        {i['dir']}")
        print(f"entries    {i['entries']} ({i['stale']} of an older compiler version)")
        print(f"size       {human(i['bytes'])} ({i['bytes']} bytes)")
        print(f"cap        {human(i['max_bytes'])} (TESSERA_CACHE_MAX; least recently used evicted)")
        print(f"repro/     {human(i['repro_bytes'])};  tuning/ {human(i['tuning_bytes'])}")
        return 0
    if args.action in ("ls", "list"):
        now, current = time.time(), cache.source_hash()
        print(f"{'key':16}  {'size':>10}  {'used':>5}  {'made':>5}  {'target':7} function")
        for e in cache_admin.listing():
            m = e.meta
            made = _age(now - m["created"]) if isinstance(m.get("created"), (int, float)) else "?"
            stale = "" if m.get("version") == current else "  (older compiler)"
            print(f"{e.key[:16]}  {human(e.size):>10}  {_age(now - e.mtime):>5}  {made:>5}  "
                  f"{str(m.get('target', '?')):7} {m.get('function', '?')}{stale}")
        return 0
    if args.action == "clear":
        n, freed = cache_admin.clear(tuning=args.tuning, repro=args.repro)
        print(f"removed {n} entries, {human(freed)}")
        return 0
    size = None if args.max_size is None else cache_admin.parse_size(args.max_size, "--max-size")
    stale, evicted, freed = cache_admin.prune(size)
    print(f"removed {stale} entries of an older compiler version and {evicted} least recently used; "
          f"freed {human(freed)}")
    return 0
