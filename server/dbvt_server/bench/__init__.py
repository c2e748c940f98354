"""dbvt-server's benchmarks, one command `dbvt-bench` (see __main__): the core beside python-fcl
(`core`), the service over the wire (`wire`, with its controls `floor` and `parallel`), and the W1
and W2 workloads they run on (`workload`, with their exact answers from `exact`)."""
import os

# numpy's OpenBLAS threads spin on the other core after start-up and bill a benchmark's CPU time; no
# benchmark does linear algebra, so one thread is right. It must be set before anything imports
# numpy: here, before any of the benchmarks' modules (console imports numpy first).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
