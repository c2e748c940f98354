"""What every dbvt-bench command prints around its figures.

The benchmarks run on shared, often virtual machines whose speed changes from minute to minute, so
a figure means little without the command that made it, the machine it ran on, and how busy that
machine was: each command prints these first, and the load average again at its end. Progress goes
to stderr, as a redrawn bar only on a terminal; a log or a pipe gets one plain line per phase.
"""
from __future__ import annotations

import os
import platform
import shlex
import sys
from pathlib import Path

import numpy as np

PROG = "dbvt-bench"


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return " ".join(f"{load:.2f}" for load in os.getloadavg())


def machine() -> dict:
    """The CPU model, core count and clock, and the software the figures depend on."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        cpuinfo = []

    def field(name: str) -> list[str]:
        return [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith(name)]

    models, speeds = field("model name"), field("cpu MHz")
    import dbvt

    return {"cpu": (models[0] if models else platform.processor() or platform.machine())
                   + (f" at {float(speeds[0]):.0f} MHz" if speeds else ""),
            "cores": os.cpu_count(), "python": f"{platform.python_implementation()} {platform.python_version()}",
            "platform": platform.platform(), "numpy": np.__version__, "dbvt": dbvt.__version__}


def header(argv: list[str]) -> dict:
    """Print the command line, the machine and the load average; return them for a JSON report."""
    facts = {"command": shlex.join([PROG, *argv]), "machine": machine(), "load_start": load_average()}
    m = facts["machine"]
    print(f"command: {facts['command']}\n"
          f"machine: {m['cpu']}, {m['cores']} cores; {m['python']} on {m['platform']}; "
          f"numpy {m['numpy']}, dbvt {m['dbvt']}\n"
          f"load average (1/5/15 min) at start: {facts['load_start']}", flush=True)
    return facts


def footer(facts: dict) -> None:
    facts["load_end"] = load_average()
    print(f"load average (1/5/15 min) at end: {facts['load_end']}", flush=True)


class Progress:
    """A phase of `total` parts on stderr: a bar redrawn in place on a terminal, else one line."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.done = label, total, 0
        self.redraw = sys.stderr.isatty()
        if not self.redraw:
            sys.stderr.write(f"{label}: {total} steps\n")
            sys.stderr.flush()

    def advance(self) -> None:
        self.done += 1
        if not self.redraw:
            return
        filled = 30 * self.done // max(self.total, 1)
        sys.stderr.write(f"\r{self.label:<28} [{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total}")
        if self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()
