"""Thin `@activity.defn` adapters, one class per resource (env, decode, reward, trainer): load inputs, call a pure
core, heartbeat, return a contracts model; resources are injected by `workers/`."""
