"""Reward functions (`trajflow.rewards.registry`), the stateless reward service (`trajflow.rewards.service`, HTTP) and
its client (`trajflow.rewards.client`). Imports web framework, HTTP client, pydantic, stdlib and `contracts` only."""
