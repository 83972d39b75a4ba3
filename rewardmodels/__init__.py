"""Local reward models served over HTTP, batched: `python -m rewardmodels.server` / `trajflow reward-model serve`."""
