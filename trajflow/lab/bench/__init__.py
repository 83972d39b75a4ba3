"""Benchmarks: the pipeline benchmark (sync vs async on a synthetic workload), the sandbox benchmark, the GPU
check (`gpu_check`), the decode/trainer contention benchmark (`contention`) and LoRA against the last-k-blocks
trainer (`lora`), with their workloads, stacks, simulated pieces and reports; never imported by the core
packages."""
