"""Composition roots: one entry point per pool kind (orchestrator, decode, env, reward, trainer) that builds the
resources, injects them into the activities and runs the Temporal workers."""
