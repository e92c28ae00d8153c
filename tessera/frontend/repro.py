"""Compile-failure reproducers: when the compiler fails on a program it accepted, the Graph IR
it was given, the pass pipeline and the target are written to one ``.mlir`` file, so

    tessera-opt <file> --pass-pipeline='<spec>'

replays the passes outside the process that failed.  The header lines are ``//`` comments,
which the IR parser skips; one of them is the exact ``tessera-opt`` command.  The file goes
to ``TESSERA_REPRO_DIR`` if set, else to ``repro/`` in the compile-cache directory.
"""
from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from tessera.errors import CacheError
from tessera.runtime import cache

HEADER_TOOL = "// tessera-opt: "
MAX_REASON = 400


def repro_dir() -> Path:
    d = os.environ.get("TESSERA_REPRO_DIR")
    return Path(d) if d else cache.cache_dir() / "repro"


def render(graph_text: str, spec: str, *, target: str, arch: str, cpu: str, features: str, name: str,
           reason: str) -> str:
    """The reproducer's text: comment header, then the Graph IR."""
    reason = " ".join(reason.split())
    if len(reason) > MAX_REASON:
        reason = reason[:MAX_REASON] + " ..."
    lines = [
        f"// Tessera compile-failure reproducer for {name!r}",
        f"// error: {reason}",
        f"// target={target} arch={arch} cpu={cpu or '-'}",
        f"// features={features or '-'}",
        "// The Graph IR below is what the pipeline was given.  The command replays the passes; if",
        "// they succeed, the failure is in translation to LLVM IR / object code after them.",
        f"{HEADER_TOOL}--pass-pipeline={shlex.quote(spec)}",
    ]
    return "\n".join(lines) + "\n" + graph_text.rstrip("\n") + "\n"


def write(graph_text: str, spec: str, *, target: str, arch: str, cpu: str, features: str, name: str,
          key: str, reason: str) -> tuple[Path | None, str]:
    """Write the reproducer; (path, "") or (None, why it could not be written)."""
    text = render(graph_text, spec, target=target, arch=arch, cpu=cpu, features=features, name=name,
                  reason=reason)
    d = repro_dir()
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:60] or "graph"
    path = d / f"repro-{safe}-{key[:12]}.mlir"
    try:
        if "TESSERA_REPRO_DIR" in os.environ:
            d.mkdir(parents=True, exist_ok=True)
        else:
            cache.ensure_dir(cache.cache_dir())
            cache.ensure_dir(d)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        return None, f"{d}: {e.strerror or e}"
    except CacheError as e:     # an untrusted cache directory: say so, do not mask the compile error
        return None, e.message
    return path, ""


def replay_command(path: Path, spec: str) -> str:
    return f"tessera-opt {shlex.quote(str(path))} --pass-pipeline={shlex.quote(spec)}"
