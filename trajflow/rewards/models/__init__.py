"""Local reward models served over HTTP, batched: `python -m trajflow.rewards.models.server` / `trajflow reward-model
serve`."""
