"""CI plays other processors (issue 38): ``scripts/run_tests.sh --cpu-passes`` runs the suite on this machine's CPU
settings and under others that make MKL, oneDNN and ATen take other kernels; a pass that fails fails the run and is
named. And the golden-value tests pass under ATen's ``default`` kernels (no SIMD), the one kernel set those passes
do not take: tests/test_eval_outputs.py (its 3 tests, ~5 s, every file of tests/data/eval_golden/) again in a
subprocess, so a golden file that holds only for one processor's kernels fails on any machine (issue 28).
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

GOLDEN_TESTS = ["tests/test_eval_outputs.py"]
TIMEOUT_S = 300
# Prints the capability torch took from the environment, then runs pytest: its exit status is pytest's.
PROGRAM = ("import sys, pytest, torch; print('capability', torch.backends.cpu.get_cpu_capability(), flush=True); "
           "sys.exit(pytest.main(sys.argv[1:]))")


def _run(capability):
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability)
    env.pop("EVAL_GOLDEN_WRITE", None)  # compare, never rewrite
    return subprocess.run([sys.executable, "-c", PROGRAM, "-q", "-p", "no:cacheprovider"] + GOLDEN_TESTS,
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def test_golden_tests_pass_under_default_kernels():
    proc = _run("default")
    output = proc.stdout + proc.stderr
    assert output.startswith("capability DEFAULT\n"), output[-3000:]
    assert proc.returncode == 0 and re.search(r"^3 passed\b", output, re.M), output[-3000:]


def _has_flag(flag):
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and flag in line.split() for line in f)
    except OSError:
        return False


@pytest.mark.skipif(not _has_flag("avx2"),
                    reason="the AVX2 pass takes other kernels only on an x86 processor with AVX2")
def test_cpu_passes_name_the_setting_that_fails(tmp_path):
    """The real scripts/run_tests.sh, copied with a set-up that installs nothing (the venv is this one), on a test
    that fails only under the AVX2 pass's setting: the other passes pass, the run exits 1 naming the AVX2 pass, whose
    line names the kernels ATen took."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(os.path.join(ROOT, "scripts", "run_tests.sh"), tmp_path / "scripts")
    (tmp_path / "scripts" / "setup_env.sh").write_text("#!/bin/sh\n")
    os.chmod(tmp_path / "scripts" / "setup_env.sh", 0o755)
    os.symlink(sys.prefix, tmp_path / ".venv")
    # fails under the AVX2 pass's setting alone, on any processor (on an AVX2-only one every pass runs AVX2 kernels)
    (tmp_path / "test_kernels.py").write_text(
        "import os\n\n\ndef test_not_avx2():\n    assert os.environ.get('ATEN_CPU_CAPABILITY') != 'avx2'\n")
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS")}
    proc = subprocess.run(["bash", str(tmp_path / "scripts" / "run_tests.sh"), "--cpu-passes", "-p", "no:cacheprovider",
                           "test_kernels.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr[-2000:]
    assert re.search(r"^\[tests\] pass avx2-1-thread: .*ATEN_CPU_CAPABILITY=avx2 .*\(ATen kernels: AVX2\)$", out, re.M)
    assert re.search(r"^\[tests\] pass native passed in ", out, re.M), out
    assert re.search(r"^\[tests\] pass avx512-no-amx passed in ", out, re.M), out
    # ATen would run AVX-512 kernels on a processor without them (illegal instruction): the pass leaves it out there
    if _has_flag("avx512f"):
        assert re.search(r"^\[tests\] pass avx512-no-amx: .*ATEN_CPU_CAPABILITY=avx512 \(ATen kernels: AVX512\)$",
                         out, re.M), out
    else:
        assert "[tests] pass avx512-no-amx: this processor has no AVX-512 (ATen's best: avx2); " \
               "ATEN_CPU_CAPABILITY=avx512 left out" in out, out
        assert re.search(r"^\[tests\] pass avx512-no-amx: MKL_ENABLE_INSTRUCTIONS=SSE4_2 "
                         r"ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI \(ATen kernels: AVX2\)$", out, re.M), out
    assert out.strip().splitlines()[-1] == ("[tests] FAILED under avx2-1-thread: MKL_ENABLE_INSTRUCTIONS=AVX2 "
                                            "ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=1")
