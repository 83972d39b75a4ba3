"""Environments: the runner that hosts one GEM env inside a sandbox, and chat formatting of observations."""
