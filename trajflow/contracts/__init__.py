"""Every workflow, activity and signal input and result, the run config schema, the records and summaries trajflow
writes, and the names of queues, activities, queries and signals. Every model derives from
`trajflow.contracts.base.Contract`. Imports pydantic and the standard library only."""
