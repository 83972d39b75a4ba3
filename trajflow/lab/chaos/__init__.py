"""The chaos harness (`trajflow chaos`): train on the embedded stack while killing its workers, the trainer, the
Temporal server and sandboxes, then audit the run's records; never imported by the core packages."""
