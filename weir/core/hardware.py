"""What a TaskManager's machine offers it, as Flink's ``HardwareDescription`` reports it: the CPU cores
the process may run on and the machine's physical memory. Measured once when the TaskManager starts
and sent with its registration; the JobManager's REST API shows it (``GET /taskmanagers``)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    cpu_cores: int  # the cores the process may run on (its CPU affinity, as Java's availableProcessors)
    physical_memory_bytes: int  # the machine's; 0: not known


def measure_hardware() -> Hardware:
    """This process's cores and the machine's physical memory (0 where the platform does not say)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 0
    return Hardware(cpu_cores=cores, physical_memory_bytes=max(0, memory))
