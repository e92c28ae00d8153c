"""Shared fixtures.

- Every test session gets a fresh compile-cache directory (so no test depends on a
  previous run) and fresh random data: the seed is printed in the header and can be
  replayed with TESSERA_TEST_SEED=<seed>.
- Strict dispatch is enforced: a test fails if any call ran the reference lane
  without asking for it (strict=False).
"""
from __future__ import annotations

import os
import secrets
import sys
import tempfile
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

# Set in the environment so pytest-xdist's workers (started after this import) share the
# seed and the cache directory of the controller.
SEED = int(os.environ.setdefault("TESSERA_TEST_SEED", str(secrets.randbits(32))))
if "TESSERA_CACHE_DIR" not in os.environ:
    os.environ["TESSERA_CACHE_DIR"] = tempfile.mkdtemp(prefix="tessera-test-cache-")


def pytest_report_header(config):
    return [f"tessera test seed: {SEED} (replay with TESSERA_TEST_SEED={SEED})",
            f"tessera cache dir: {os.environ['TESSERA_CACHE_DIR']}"]


@pytest.fixture
def rng(request) -> np.random.Generator:
    return np.random.default_rng([SEED, zlib.crc32(request.node.nodeid.encode())])


@pytest.fixture(autouse=True)
def strict_dispatch():
    from tessera.runtime.lanes import LOG
    before = len(LOG.entries)
    yield
    unexpected = [e for e in LOG.entries[before:] if e.lane == "reference" and not e.requested_fallback]
    assert not unexpected, f"unrequested fallback to the reference lane: {unexpected}"
