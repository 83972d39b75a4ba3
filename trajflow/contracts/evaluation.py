"""A run's held-out evaluation (`[train.eval]`): which seeds, how many episodes before and after training, and how
often during it. What the evaluation reports is `trajflow.contracts.runs.EvalResult`; `trajflow train` and
`trajflow eval` run it (`trajflow.cli.commands.evaluate`, `eval_curve`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from trajflow.contracts.trainer import NanSafeContract

_Model = NanSafeContract


DURING_EPISODES = 20
"""The default episodes of each held-out eval during training (`EvalConfig.during_episodes`)."""


class EvalConfig(_Model):
    episodes: Annotated[int, Field(ge=0, le=10_000)] = 50
    """Held-out episodes evaluated greedily before and after training by `trajflow train` (0: no eval)."""
    first_seed: int = 1_000_000
    """Held-out seeds are first_seed, first_seed+1, ...; training seeds must not reach them."""
    every: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    """Held-out evals during training: `trajflow train` evaluates versions every, 2·every, ... (below the last
    step, which the eval after training covers) greedily on the first `during_episodes` held-out seeds, while the
    run goes on, for summary.json's `eval_curve` and the trackers' `eval_curve/` scalars. 0: before and after
    training only. Each costs decode time that training's trajectories wait for (docs/training.md)."""
    during_episodes: Annotated[int, Field(ge=1, le=10_000)] | None = None
    """Episodes of each eval during training: the held-out seeds first_seed .. first_seed + during_episodes - 1, the
    same every time (a subset of the evals before and after, so their first seeds give the curve's first and last
    points). None: min(episodes, 20). At most `episodes`."""
    defer: bool = False
    """Evaluate the due versions after training instead of beside it: each is held in the store until the run ends,
    then evaluated, after the eval after training; the curve is the same (every eval is pinned to its version). An
    eval beside training shares the decode worker and the CPU with it and costs it several times its own time on a
    small CPU (2 cores: a 10-episode eval that takes seconds alone made 10 steps 12% longer); deferred, it costs
    its own time once training is done. False: beside training, as the versions are published."""

    @model_validator(mode="after")
    def _periodic(self) -> EvalConfig:
        if self.every and self.episodes == 0:
            raise ValueError(f"eval.every ({self.every}) needs held-out episodes; eval.episodes is 0")
        if self.during_episodes is not None and self.during_episodes > self.episodes:
            raise ValueError(
                f"eval.during_episodes ({self.during_episodes}) must not exceed eval.episodes ({self.episodes}): "
                "its seeds are the first of the held-out seeds"
            )
        return self

    def curve_episodes(self) -> int:
        """Episodes of each eval during training: `during_episodes`, by default min(episodes, 20)."""
        return self.during_episodes if self.during_episodes is not None else min(self.episodes, DURING_EPISODES)
