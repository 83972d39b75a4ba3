"""The lab: benchmarks (`trajflow.lab.bench`) and the chaos harness (`trajflow.lab.chaos`), with their workloads,
simulated pieces and reports. Only the CLI's `bench` and `chaos` commands import it, inside those commands; nothing
else of trajflow does."""
