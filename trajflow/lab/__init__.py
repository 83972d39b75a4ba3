"""The lab: benchmarks (`trajflow.lab.bench`), the chaos harness (`trajflow.lab.chaos`) and analyses of what a policy
does (`trajflow.lab.analysis`), with their workloads, simulated pieces and reports. Only the CLI's `bench`, `chaos`
and `analyze` commands import it, inside those commands; nothing else of trajflow does."""
