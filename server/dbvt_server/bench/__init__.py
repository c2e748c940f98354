"""dbvt-server's benchmarks, one command `dbvt-bench` (see __main__): the core beside python-fcl
(`core`), the service over the wire (`wire`, with its controls `floor` and `parallel`), and the W1
and W2 workloads they run on (`workload`, with their exact answers from `exact`)."""
