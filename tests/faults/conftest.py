"""Shared fixtures of the fault tests: the tiny task's config and its uninterrupted run."""
import os

import pytest

from tests.faults import harness, tiny_task


@pytest.fixture(scope="session")
def tiny_cfg(tmp_path_factory):
    """Path of the tiny task's YAML (3 epochs, see tiny_task.write_config)."""
    return tiny_task.write_config(tmp_path_factory.mktemp("tiny_cfg"))


@pytest.fixture(scope="session")
def clean_state(tiny_cfg, tmp_path_factory):
    """The final training state of an uninterrupted run (in this process: the killed runs, in child
    processes, must also match it bit for bit)."""
    model_dir = tmp_path_factory.mktemp("clean")
    assert harness.run_here(tiny_cfg, model_dir) == 0
    return harness.training_state(os.path.join(harness.out_dir(model_dir), harness.FINAL))
