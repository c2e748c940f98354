"""dbvt-server's benchmarks: the core beside python-fcl (`core`), the service over the wire (`wire`,
with its controls `floor` and `parallel`), and the workloads they run on."""
