#!/usr/bin/env bash
# Installs what the tests need (once) and runs the default test suite (slow tests excluded), one pytest worker
# per core.
#   usage: scripts/run_tests.sh [--cpu-passes] [pytest args...]     e.g. --runslow, -k config
#   --cpu-passes (what CI runs): the suite once on this machine's CPU settings, then once under each setting of
#                CPU_PASSES below, which make MKL, oneDNN and ATen take other kernels, as on another processor: a
#                float compared exactly between two computations fails there. Exits 1 naming each failed pass.
#                Each pass prints its 25 slowest tests (--durations=25).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup_env.sh" --test
cd "$ROOT"
# -n auto --dist loadfile: one worker per core (pytest-xdist), each test file on one worker (its module fixtures
# made once).
PYTEST=("$ROOT/.venv/bin/python" -m pytest -q -n auto --dist loadfile)
if [ "${1:-}" != "--cpu-passes" ]; then
    exec "${PYTEST[@]}" "$@"
fi
shift
PYTEST+=(--durations=25)
# name|environment. An MKL or oneDNN setting above what the processor has is ignored by the library (it takes its
# best); ATen's is not (see below).
# avx2-1-thread: an AVX2 processor, one thread. avx512-no-amx: oneDNN and ATen as on an AVX-512 processor without
# AMX (AMD EPYC), MKL's SSE4.2 GEMM: its kernels farthest from the AVX-512 ones (near-tied scores reorder there).
CPU_PASSES=(
    "native|"
    "avx2-1-thread|MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=1"
    "avx512-no-amx|MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI ATEN_CPU_CAPABILITY=avx512"
)
# ATen runs the kernels it is told to even where the processor lacks their instructions (an illegal instruction,
# not a fallback): a pass asking for AVX-512 on a processor without it runs ATen's own best instead.
best="$("$ROOT/.venv/bin/python" -c 'import torch; print(torch.backends.cpu.get_cpu_capability().lower())')"
failed=()
for pass in "${CPU_PASSES[@]}"; do
    name="${pass%%|*}"
    settings="${pass#*|}"
    if [[ " $settings " == *" ATEN_CPU_CAPABILITY=avx512 "* && "$best" != avx512 ]]; then
        settings="$(echo $settings | sed 's/ *ATEN_CPU_CAPABILITY=avx512//')"
        echo "[tests] pass $name: this processor has no AVX-512 (ATen's best: $best); ATEN_CPU_CAPABILITY=avx512 left out"
    fi
    shown="$settings"
    [ -n "$shown" ] || shown="this machine's settings"
    capability="$(env $settings "$ROOT/.venv/bin/python" -c \
        'import torch; print(torch.backends.cpu.get_cpu_capability())')"
    echo "[tests] pass $name: $shown (ATen kernels: $capability)"
    start=$SECONDS
    if env $settings "${PYTEST[@]}" "$@"; then
        echo "[tests] pass $name passed in $((SECONDS - start)) s"
    else
        echo "[tests] pass $name FAILED in $((SECONDS - start)) s"
        failed+=("$name: $shown")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    printf '[tests] FAILED under %s\n' "${failed[@]}"
    exit 1
fi
echo "[tests] all ${#CPU_PASSES[@]} CPU passes passed"
