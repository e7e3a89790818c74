"""Pytest set-up: the repository root is importable and slow tests run only on request."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# The reference release's paper configs, its loader's effective VCR values and its VCR state-dict
# shapes: test data kept in the repository (the tests read nothing outside it).
LEGACY = os.path.join(ROOT, "tests", "data", "legacy")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="also run tests marked slow")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than ~20 s on 2 cores; run with --runslow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip_slow = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)
