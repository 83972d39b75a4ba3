"""Every workflow, activity and signal input and result, the run config schema, and the names of queues and
activities. Imports pydantic and the standard library only."""
