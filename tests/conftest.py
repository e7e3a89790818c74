"""Pytest set-up: the repository root is importable and slow tests run only on request."""
import importlib
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# The reference release's paper configs, its loader's effective VCR values and its VCR state-dict
# shapes: test data kept in the repository (the tests read nothing outside it).
LEGACY = os.path.join(ROOT, "tests", "data", "legacy")


def load_task(name):
    """The registered :class:`common.task.Task` of the task folder ``name`` (imports ``<name>.task``)."""
    return importlib.import_module(name + ".task").TASK


def slow_cases(cases, slow):
    """``cases`` for ``pytest.mark.parametrize``, those named in ``slow`` marked slow: the default suite keeps one
    case of each path (every task; one ViT image encoder) and ``--runslow`` runs them all."""
    unknown = set(slow) - set(cases)
    assert not unknown, unknown
    return [pytest.param(c, marks=pytest.mark.slow) if c in slow else c for c in cases]


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


@pytest.fixture(scope="session")
def tiny_vcr(tmp_path_factory):
    """Inputs of the tiny VCR runs (:mod:`tests.tiny_vcr`), made once per session."""
    from tests.tiny_vcr import make_inputs
    return make_inputs(tmp_path_factory.mktemp("tiny_vcr"))


@pytest.fixture(scope="session")
def tiny_init(tmp_path_factory, tiny_vcr):
    """A tiny run at LR 0: its checkpoint holds the initial weights of every tiny run (same seed and
    architecture). Returns (model dir, orientations of each training batch's images)."""
    from tests.tiny_vcr import train_recording_orientations
    model_dir = tmp_path_factory.mktemp("init")
    code, batches = train_recording_orientations(model_dir, tiny_vcr.opts(TRAIN__LR=0.0))
    assert code == 0
    return model_dir, batches



@pytest.fixture(scope="session")
def tiny_pretrain(tmp_path_factory):
    """Inputs of the tiny pretraining runs (:mod:`tests.tiny_pretrain`), made once per session."""
    from tests.tiny_pretrain import make_inputs
    return make_inputs(tmp_path_factory.mktemp("tiny_pretrain"))
