"""Benchmarks: the soak runs (a long training run on the simulated stack, direct and sharded, audited for lost
trajectories), the state-size sizing of the training workflow, and the GPU check (`gpu_check`), with their
workloads, stacks and simulated pieces; never imported by the core packages. Finished studies live in docs/results,
their code in git history."""
