"""The host's arch: a virtual machine may hide features its CPU name implies (a Zen 4 guest
without AVX-512 still reports ``znver4``); code for the host must never use them."""
from __future__ import annotations

import pytest

from tessera.mma import x86 as X


@pytest.fixture
def fake_host(monkeypatch):
    def install(name, feats):
        monkeypatch.setattr(X, "host_cpu", lambda: (name, frozenset(feats)))
    return install


def test_host_name_whose_table_does_not_hold_resolves_to_host(fake_host):
    fake_host("znver4", X.CPUS["znver3"] | {"popcnt"})   # AVX-512 hidden by the hypervisor
    name, cpu, feats = X.resolve(None)
    assert (name, cpu) == ("host", "znver4")
    assert "avx512f" not in feats
    assert X.resolve("host")[0] == "host"
    # an explicit arch still means the table's chip
    assert "avx512f" in X.resolve("znver4")[2]


def test_host_name_whose_table_holds_keeps_its_name(fake_host):
    fake_host("znver4", X.CPUS["znver4"] | {"popcnt"})
    assert X.resolve(None)[0] == "znver4"


def test_feature_string_turns_off_vector_features_not_granted():
    s = X.llvm_feature_string(X.CPUS["znver3"]).split(",")
    assert "+avx2" in s and "+fma" in s
    if X._vector_isa_features():            # an x86 host's LLVM
        assert "-avx512f" in s and "-amx-tile" in s and "-avx512bf16" in s
        assert not any(f[1:] in X.CPUS["znver3"] for f in s if f.startswith("-"))
