"""Tool discovery: wheels first, a system tool only when newer, TESSERA_TOOLCHAIN=bundled ignores
PATH, and a missing tool is named with how to get it.  Fake tools are shell scripts on a PATH
made for the test; the real ones are the test extra's wheels."""
from __future__ import annotations

import importlib.metadata
import platform
import sys

import pytest

from tessera import toolchain
from tessera.codegen import hsaco
from tessera.errors import CodegenError, ToolchainMissingError
from tessera.tools import cli

KERNEL_IR = """
target triple = "amdgcn-amd-amdhsa"
define amdgpu_kernel void @k(ptr addrspace(1) %out) {
  store i32 7, ptr addrspace(1) %out, align 4
  ret void
}
"""
WHEELS_HERE = sys.platform == "linux" and platform.machine() == "x86_64"


@pytest.fixture(autouse=True)
def fresh_discovery(monkeypatch):
    """Each test starts from the default setting (CI runs the suite under bundled) and no cache."""
    monkeypatch.setenv("TESSERA_TOOLCHAIN", "auto")
    toolchain.clear_cache()
    yield
    toolchain.clear_cache()


def fake_tool(directory, name: str, version_line: str):
    """A script named ``name`` that prints ``version_line`` for --version and otherwise records
    that it ran (in ``<name>.ran``) and fails, as a broken tool would."""
    exe = directory / name
    marker = directory / f"{name}.ran"
    exe.write_text(f"#!/bin/sh\nif [ \"$1\" = --version ]; then echo '{version_line}'; exit 0; fi\n"
                   f"echo ran > '{marker}'\necho 'error: fake {name}' >&2\nexit 1\n")
    exe.chmod(0o755)
    return marker


def with_path_first(monkeypatch, directory):
    """PATH is ``directory`` alone: a machine that has LLVM installed (``/usr/bin/ld.lld-19``) must
    not change what these tests see (the fake tools' ``#!/bin/sh`` needs no PATH)."""
    monkeypatch.setenv("PATH", str(directory))


@pytest.fixture
def no_zig(monkeypatch):
    monkeypatch.setattr(toolchain, "zig_binary", lambda: None)


# --------------------------------------------------------------------------- the wheels
@pytest.mark.skipif(not WHEELS_HERE, reason="the nvidia wheels exist for x86_64 Linux only")
def test_bundled_finds_every_wheel_tool_at_the_pinned_versions(monkeypatch):
    """What `./dev` installs is the whole set-up: ld.lld, ptxas and nvdisasm come from wheels."""
    monkeypatch.setenv("TESSERA_TOOLCHAIN", "bundled")
    found = toolchain.status()
    lld, ptxas, nvdisasm = found["ld.lld"], found["ptxas"], found["nvdisasm"]
    assert lld and lld.source == "wheel:ziglang" and lld.command[1:] == ("ld.lld",)
    assert lld.version[0] >= 22 and importlib.metadata.version("ziglang").startswith("0.17.")
    assert ptxas and ptxas.source == "wheel:nvidia-cuda-nvcc" and ptxas.version[:2] == (13, 0)
    assert importlib.metadata.version("nvidia-cuda-nvcc").startswith("13.0.")
    assert nvdisasm and nvdisasm.source == "wheel:nvidia-cuda-nvdisasm" and nvdisasm.version[0] == 13
    assert "site-packages" in ptxas.command[0] and "site-packages" in lld.command[0]
    # no wheel ships llvm-objdump/llvm-readelf: bundled mode never has them
    assert found["llvm-objdump"] is None and found["llvm-readelf"] is None


def test_the_zig_linker_links_an_amdgpu_code_object(monkeypatch):
    monkeypatch.setenv("TESSERA_TOOLCHAIN", "bundled")
    if toolchain.zig_binary() is None:
        pytest.fail("the ziglang wheel is missing: ./dev installs it (pyproject.toml's test extra)")
    blob = hsaco.link(hsaco.compile_object(KERNEL_IR, "gfx942").obj, "gfx942")
    assert hsaco.inspect(blob).kernels[0].name == "k"


# --------------------------------------------------------------------------- bundled vs PATH
def test_bundled_ignores_a_newer_system_ld_lld(tmp_path, monkeypatch):
    marker = fake_tool(tmp_path, "ld.lld", "LLD 99.0.0 (compatible with GNU linkers)")
    with_path_first(monkeypatch, tmp_path)
    obj = hsaco.compile_object(KERNEL_IR, "gfx90a").obj

    # default: the newer system tool wins, is run, and its failure is reported as ld.lld's
    tool = toolchain.find("ld.lld", 19)
    assert tool.source == "system" and tool.command == (str(tmp_path / "ld.lld"),) and tool.version == (99, 0, 0)
    with pytest.raises(CodegenError, match="ld.lld failed: error: fake ld.lld"):
        hsaco.link(obj, "gfx90a")
    assert marker.exists()
    marker.unlink()

    # bundled: PATH is not looked at; the wheel's linker links, the fake never runs
    monkeypatch.setenv("TESSERA_TOOLCHAIN", "bundled")
    toolchain.clear_cache()
    tool = toolchain.find("ld.lld", 19)
    assert tool is not None and tool.source == "wheel:ziglang"
    assert hsaco.inspect(hsaco.link(obj, "gfx90a")).arch == "gfx90a"
    assert not marker.exists()


def test_an_older_or_equal_system_tool_does_not_displace_the_wheel(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_TOOLCHAIN", "bundled")
    wheel = toolchain.find("ptxas")
    if wheel is None and not WHEELS_HERE:
        pytest.skip("needs the nvidia-cuda-nvcc wheel (x86_64 Linux)")
    monkeypatch.setenv("TESSERA_TOOLCHAIN", "auto")
    fake_tool(tmp_path, "ld.lld-20", "Ubuntu LLD 20.1.0 (compatible with GNU linkers)")
    fake_tool(tmp_path, "ptxas", "Cuda compilation tools, release 13.0, V" + ".".join(map(str, wheel.version)))
    with_path_first(monkeypatch, tmp_path)
    toolchain.clear_cache()
    assert toolchain.find("ld.lld", 19).source == "wheel:ziglang"        # LLD 20 < the wheel's 22
    assert toolchain.find("ptxas").source == "wheel:nvidia-cuda-nvcc"    # equal: the pinned wheel
    fake_tool(tmp_path, "ptxas", "Cuda compilation tools, release 13.9, V13.9.1")
    toolchain.clear_cache()
    assert toolchain.find_ptxas() == str(tmp_path / "ptxas")              # newer: the system's


def test_a_too_old_system_tool_is_refused(tmp_path, monkeypatch, no_zig):
    fake_tool(tmp_path, "ld.lld", "Debian LLD 14.0.6 (compatible with GNU linkers)")
    with_path_first(monkeypatch, tmp_path)
    assert toolchain.find("ld.lld", 0).version == (14, 0, 6)
    assert toolchain.find_llvm_tool("ld.lld") is None
    with pytest.raises(ToolchainMissingError, match=r"ld\.lld >= 19 is needed to link AMDGPU code objects"):
        hsaco.link(b"\x7fELF", "gfx942")


def test_versioned_system_binaries_newest_first(tmp_path, monkeypatch, no_zig):
    fake_tool(tmp_path, "llvm-objdump-19", "LLVM version 19.1.7")
    fake_tool(tmp_path, "llvm-objdump-21", "LLVM version 21.1.2")
    fake_tool(tmp_path, "llvm-objdump", "LLVM version 14.0.6")
    with_path_first(monkeypatch, tmp_path)
    assert toolchain.find_llvm_tool("llvm-objdump") == (str(tmp_path / "llvm-objdump-21"),)
    assert hsaco.objdump_for("gfx950") == (str(tmp_path / "llvm-objdump-21"),)
    monkeypatch.setenv("TESSERA_TOOLCHAIN", "bundled")
    assert toolchain.find_llvm_tool("llvm-objdump") is None and hsaco.objdump_for("gfx942") is None


# --------------------------------------------------------------------------- missing and misconfigured
def test_missing_in_bundled_mode_says_how_to_get_it(monkeypatch, no_zig):
    monkeypatch.setenv("TESSERA_TOOLCHAIN", "bundled")
    with pytest.raises(ToolchainMissingError) as e:
        hsaco.link(b"\x7fELF", "gfx942")
    text = str(e.value)
    assert e.value.code == "TOOLCHAIN_MISSING"
    assert "ld.lld >= 19" in text and "PATH is not searched" in text
    assert "ziglang wheel" in text and "./dev installs it" in text and "tessera[test]" in text


def test_unknown_toolchain_setting_is_refused(monkeypatch):
    monkeypatch.setenv("TESSERA_TOOLCHAIN", "bundeld")
    with pytest.raises(ToolchainMissingError, match="'bundeld' is not a toolchain setting; use one of: auto, bundled"):
        toolchain.find("ptxas")
    monkeypatch.setenv("TESSERA_TOOLCHAIN", "")
    assert toolchain.mode() == "auto"
    with pytest.raises(ValueError, match="unknown tool 'lld'"):
        toolchain.find("lld")


# --------------------------------------------------------------------------- tessera doctor
def doctor(capsys) -> dict[str, str]:
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    rows = {}
    for line in out.splitlines():
        words = line.split()
        if line.startswith("  ") and words and words[0] in toolchain.ALL_TOOLS:
            rows[words[0]] = line
    assert set(rows) == set(toolchain.ALL_TOOLS), out
    return rows | {"text": out}


def test_doctor_prints_every_tool_its_version_and_origin(capsys):
    rows = doctor(capsys)
    for name, tool in toolchain.status().items():
        words = rows[name].split()
        if tool is None:
            assert words[1:3] == ["-", "absent"]
        else:
            assert words[1:4] == [tool.version_text, tool.source, tool.command[0]]
        assert f"enables: {toolchain.ENABLES[name]}" in rows["text"]
    assert "cpu-x86           compiles" in rows["text"] and "devices:" in rows["text"]


def test_doctor_in_bundled_mode_names_the_ignored_system_tool(tmp_path, monkeypatch, capsys):
    fake_tool(tmp_path, "ld.lld", "LLD 99.0.0")
    with_path_first(monkeypatch, tmp_path)
    rows = doctor(capsys)
    assert rows["ld.lld"].split()[1:3] == ["99.0.0", "system"]
    monkeypatch.setenv("TESSERA_TOOLCHAIN", "bundled")
    rows = doctor(capsys)
    assert "TESSERA_TOOLCHAIN=bundled" in rows["text"].splitlines()[0]
    assert rows["ld.lld"].split()[2] == "wheel:ziglang"
    assert f"ignored: {tmp_path / 'ld.lld'} (99.0.0) on PATH, as TESSERA_TOOLCHAIN=bundled says" in rows["text"]


def test_doctor_with_ld_lld_missing_says_what_it_costs(monkeypatch, capsys, no_zig):
    monkeypatch.setenv("TESSERA_TOOLCHAIN", "bundled")
    rows = doctor(capsys)
    assert rows["ld.lld"].split()[1:3] == ["-", "absent"]
    assert "rocm-<gfx arch>   cannot compile: ld.lld missing" in rows["text"]
    assert f"get it: {toolchain.INSTALL_HINT['ld.lld']}" in rows["text"]
