"""bench/machine.py: the machine state printed next to a benchmark's figures (issue 28, part C)."""
import os
import subprocess
import sys

import pytest
import torch

from bench import machine
from tests.conftest import ROOT


def test_cpu_model_is_the_first_model_name_of_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz\n"
                    "\nprocessor\t: 1\nmodel name\t: Other\n")
    assert machine.cpu_model(str(info)) == "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz"
    assert machine.cpu_model(str(tmp_path / "absent")) == (__import__("platform").processor() or "unknown")


@pytest.mark.parametrize("load, word", [((0.49, 1.0, 2.0), "idle"), ((0.5, 0.1, 0.1), "busy"), ((7.25, 6.0, 3.5), "busy")])
def test_describe_names_load_cpu_cores_threads_and_the_verdict(monkeypatch, load, word):
    monkeypatch.setattr(os, "getloadavg", lambda: load)
    monkeypatch.setattr(machine, "cpu_model", lambda: "Test CPU")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    state = machine.machine_state()
    assert state.load == load and state.idle == (word == "idle")
    assert state.cores == os.cpu_count() and state.torch_threads == torch.get_num_threads()
    assert machine.describe(state, "start") == (
        "machine at start: load average {:.2f} {:.2f} {:.2f} (1/5/15 min): {}; CPU Test CPU; {} cores ({} usable); "
        "torch threads {}; OMP_NUM_THREADS 3".format(*load, word, os.cpu_count(), len(os.sched_getaffinity(0)),
                                                      torch.get_num_threads()))


def test_machine_state_without_torch_says_so():
    code = ("import sys; sys.path.insert(0, '.'); from bench.machine import machine_state, describe; "
            "s = machine_state(); assert 'torch' not in sys.modules; print(describe(s, 'end'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS=""), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("machine at end: load average ") and "; torch not loaded; OMP_NUM_THREADS unset" in out.stdout
