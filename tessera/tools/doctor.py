"""``tessera doctor``: every external tool, its version, where it was found (a wheel, the
system, or absent), and which lanes and features it enables — then the devices.

It only reports; the exit status is 0 whatever is missing (a missing tool is not an error
until a lane needs it, and then ``ToolchainMissingError`` names it)."""
from __future__ import annotations

from tessera import toolchain

# lane family -> (the tools its compile needs, what running it also needs)
LANES = {
    "cpu-x86": ((), "nothing more: llvmlite's LLVM is in-process"),
    "rocm-<gfx arch>": (("ld.lld",), "hip-python and a ROCm device"),
    "nvidia-<sm arch>": (("ptxas",), "cuda-python and a CUDA device"),
}


def _ignored_system(name: str, found: toolchain.Tool | None) -> str:
    """A note on a system tool that discovery did not take (bundled mode, too old, not newer)."""
    system = toolchain.system_tool(name)
    if system is None or (found is not None and found.command == system.command):
        return ""
    where = f"{system.command[0]} ({system.version_text})"
    if toolchain.mode() == "bundled":
        return f"ignored: {where} on PATH, as {toolchain.ENV}=bundled says"
    if found is None:
        return f"ignored: {where} is older than {toolchain.MIN_MAJOR.get(name, 0)}"
    return f"ignored: {where} is not newer than the wheel's"


def report() -> tuple[list[dict], str]:
    """One record per tool (name, version, source, command, enables, note) and the text."""
    rows = []
    for name, tool in toolchain.status().items():
        rows.append({"name": name, "version": tool.version_text if tool else "-",
                     "source": (tool.source if tool else "absent"),
                     "command": " ".join(tool.command) if tool else "",
                     "enables": toolchain.ENABLES[name], "note": _ignored_system(name, tool),
                     "hint": "" if tool else toolchain.INSTALL_HINT[name]})
    found = {r["name"] for r in rows if r["source"] != "absent"}
    lines = [f"tessera doctor: toolchain setting {toolchain.ENV}={toolchain.mode()}", "", "tools:"]
    for r in rows:
        lines.append(f"  {r['name']:13} {r['version']:10} {r['source']:28} {r['command']}")
        lines.append(f"  {'':13} enables: {r['enables']}")
        if r["hint"]:
            lines.append(f"  {'':13} get it: {r['hint']}")
        if r["note"]:
            lines.append(f"  {'':13} {r['note']}")
    lines += ["", "lanes (compile; run):"]
    for lane, (needs, run) in LANES.items():
        missing = [t for t in needs if t not in found]
        state = "compiles" if not missing else f"cannot compile: {', '.join(missing)} missing"
        lines.append(f"  {lane:17} {state}; running needs {run}")
    lines += ["", "devices:"]
    from tessera.runtime import cuda, hip
    for label, probe in (("CUDA", cuda.device_available), ("ROCm", hip.device_available)):
        ok, what = probe()
        lines.append(f"  {label:5} {'yes: ' if ok else 'no: '}{what}")
    return rows, "\n".join(line.rstrip() for line in lines) + "\n"


def main(_args=None) -> int:
    print(report()[1], end="")
    return 0
