"""The machine's state next to a benchmark's figures, so a reader can tell an idle figure from a busy one.

A figure counts as taken on an idle machine when the 1-minute load average was below
:data:`IDLE_LOAD` when the measurement started (issue 28: "load average under 0.5 when it starts");
the load at the end is printed too (a benchmark that runs 2 training processes raises it itself).

    from bench.machine import machine_state, describe
    start = machine_state()
    ...                                   # the measurement
    print(describe(start, "start")); print(describe(machine_state(), "end"))
"""
import os
import platform
import sys
from typing import NamedTuple, Optional, Tuple

# 1-minute load average below which a measurement counts as idle (issue 28).
IDLE_LOAD = 0.5


class MachineState(NamedTuple):
    """What the machine was doing and what it is: ``load`` (1, 5 and 15-minute load averages, runnable
    processes), ``cpu_model`` (the CPU's name), ``cores`` (``os.cpu_count()``), ``usable_cores`` (the cores
    this process may run on), ``torch_threads`` (intra-op threads of this process; None when torch is not
    imported), ``omp_num_threads`` (the ``OMP_NUM_THREADS`` environment variable, '' when unset)."""
    load: Tuple[float, float, float]
    cpu_model: str
    cores: int
    usable_cores: int
    torch_threads: Optional[int]
    omp_num_threads: str

    @property
    def idle(self):
        """Whether the 1-minute load average is below :data:`IDLE_LOAD`."""
        return self.load[0] < IDLE_LOAD


def cpu_model(cpuinfo="/proc/cpuinfo"):
    """The first ``model name`` of ``cpuinfo`` (Linux), else :func:`platform.processor`, else 'unknown'."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_state():
    """The :class:`MachineState` now (``os.getloadavg``; torch's thread count only if torch is imported)."""
    torch = sys.modules.get("torch")
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return MachineState(load=tuple(round(x, 2) for x in os.getloadavg()), cpu_model=cpu_model(),
                        cores=os.cpu_count(), usable_cores=usable,
                        torch_threads=torch.get_num_threads() if torch is not None else None,
                        omp_num_threads=os.environ.get("OMP_NUM_THREADS", ""))


def describe(state, when):
    """One line: ``machine at start: load average 0.12 0.30 0.25 (1/5/15 min): idle; CPU ...; 2 cores (2
    usable); torch threads 2; OMP_NUM_THREADS unset``. ``when`` names the moment ('start', 'end')."""
    threads = "torch threads {}".format(state.torch_threads) if state.torch_threads is not None else "torch not loaded"
    return "machine at {}: load average {:.2f} {:.2f} {:.2f} (1/5/15 min): {}; CPU {}; {} cores ({} usable); {}; " \
           "OMP_NUM_THREADS {}".format(when, *state.load, "idle" if state.idle else "busy", state.cpu_model,
                                       state.cores, state.usable_cores, threads, state.omp_num_threads or "unset")
