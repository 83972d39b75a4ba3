"""What the CLI's stack commands do: run trajectories (`rollout`, `demo`), train (`train`), show a run live
(`status RUN`), list trajectories (`trajectories list`) and manage sandbox images (`images`); never imported by
the core packages."""
