"""Deterministic orchestration: `TrajectoryWorkflow`, `TrainingWorkflow`, `ReplayEnvWorkflow` and the typed
activity stubs; imports temporalio.workflow, the stdlib and `contracts` only."""
