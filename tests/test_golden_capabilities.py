"""The golden-value tests pass under other CPU kernels than this machine's: tests/test_eval_outputs.py run again in
subprocesses with ``ATEN_CPU_CAPABILITY=default`` and ``avx2`` (where the processor has AVX2), so a golden file
that holds only for one processor's kernels fails on any machine (issue 28).

The selection: the whole of tests/test_eval_outputs.py (its 3 tests, ~5 s), which checks every file of
tests/data/eval_golden/; no other test compares with floats made on another machine.
"""
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from tests.conftest import ROOT

GOLDEN_TESTS = ["tests/test_eval_outputs.py"]
TIMEOUT_S = 300
# Prints the capability torch took from the environment, then runs pytest: its exit status is pytest's.
PROGRAM = ("import sys, pytest, torch; print('capability', torch.backends.cpu.get_cpu_capability(), flush=True); "
           "sys.exit(pytest.main(sys.argv[1:]))")


def _capabilities():
    """'default', and 'avx2' where /proc/cpuinfo lists the avx2 flag (an x86 processor that runs those kernels)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = {word for line in f if line.startswith("flags") for word in line.split()}
    except OSError:
        flags = set()
    return ["default"] + (["avx2"] if "avx2" in flags else [])


def _run(capability):
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability)
    env.pop("EVAL_GOLDEN_WRITE", None)  # compare, never rewrite
    return subprocess.run([sys.executable, "-c", PROGRAM, "-q", "-p", "no:cacheprovider"] + GOLDEN_TESTS,
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def test_golden_tests_pass_under_default_and_avx2_kernels():
    capabilities = _capabilities()
    with ThreadPoolExecutor(len(capabilities)) as pool:
        results = dict(zip(capabilities, pool.map(_run, capabilities)))
    for capability, proc in results.items():
        output = proc.stdout + proc.stderr
        assert output.startswith("capability {}\n".format(capability.upper())), output[-3000:]
        assert proc.returncode == 0 and re.search(r"^3 passed\b", output, re.M), "ATEN_CPU_CAPABILITY={}:\n{}".format(
            capability, output[-3000:])
