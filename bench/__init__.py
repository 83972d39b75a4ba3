"""Benchmarks: the pipeline benchmark (sync vs async on a synthetic workload) and the sandbox benchmark, with
their workloads, stacks, simulated pieces and reports; never imported by the core packages."""
