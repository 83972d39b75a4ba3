"""trajflow: agentic RL where every trajectory is a durable Temporal workflow. The CLI and the Python client."""
