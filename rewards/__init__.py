"""Reward functions (`rewards.registry`), the stateless reward service (`rewards.service`, HTTP) and its client
(`rewards.client`). Imports web framework, HTTP client, pydantic, stdlib and `contracts` only."""
