"""Benchmarks: the pipeline benchmark (sync vs async on a synthetic workload), the sandbox benchmark, the GPU
check (`gpu_check`) and the decode/trainer contention benchmark (`contention`), with their workloads, stacks,
simulated pieces and reports; never imported by the core packages."""
