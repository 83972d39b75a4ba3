"""Reading what a trained policy does from its recorded trajectories (e.g. how it plays a game), beyond the success
rate. Only the CLI's `analyze` commands import it, inside those commands."""
