"""`python -m trajflow` is the `trajflow` command."""

from trajflow.cli import app

app()
