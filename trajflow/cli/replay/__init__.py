"""Replay (`trajflow replay`): run a trajectory again, continue it from before its failure, re-drive its env with
the recorded actions, or check recorded histories against this code; never imported by the core packages."""
