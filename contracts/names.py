"""Names shared by every process: task queues, activity and workflow names, search attributes.

One queue per pool and stage; stateful follow-ups go to a worker's own host queue. Nothing here does I/O.
"""

from __future__ import annotations

WORKFLOW_QUEUE = "trajflow"
"""The orchestrator's queue: every workflow (trajectories, later training runs) is started here."""

TRAJECTORY_WORKFLOW = "TrajectoryWorkflow"
TRAINING_WORKFLOW = "TrainingWorkflow"

ENV_RESET = "env.reset"
ENV_STEP = "env.step"
ENV_CLOSE = "env.close"
LLM_GENERATE = "llm.generate"
REWARD_SCORE = "reward.score"
TRAJECTORY_SAVE = "trajectory.save"
TRAIN_STEP = "trainer.train_step"


def decode_queue(pool: str) -> str:
    """The queue of a decode pool (LLM steps)."""
    return f"trajflow-decode-{pool}"


def env_queue(pool: str) -> str:
    """The shared queue of an env pool: `env.reset` lands on whichever env worker is free."""
    return f"trajflow-env-{pool}"


def env_host_queue(pool: str, worker_id: str) -> str:
    """One env worker's own queue: every step of a sandbox it started goes here."""
    return f"trajflow-env-{pool}-host-{worker_id}"


def reward_queue(pool: str) -> str:
    """The queue of a reward pool (stateless: scoring and saving trajectories)."""
    return f"trajflow-reward-{pool}"


def trainer_queue(pool: str) -> str:
    """The queue of a trainer pool (optimizer steps; stateful: the worker keeps the model and optimizer)."""
    return f"trajflow-trainer-{pool}"


def policy_prefix(run_id: str) -> str:
    """Store key prefix of a run's published policy weights (`.../latest.json`, `.../v000001/...`)."""
    return f"runs/{run_id}/policy"


# Custom search attributes: registered by `trajflow up` and the test server, kept current by the workflow.
SA_ENV = "TrajflowEnv"
SA_RUN = "TrajflowRun"
SA_STATUS = "TrajflowStatus"
SA_REWARD = "TrajflowReward"
SA_POLICY_VERSION = "TrajflowPolicyVersion"
SA_ENV_FAILURES = "TrajflowEnvFailures"
SA_TURNS = "TrajflowTurns"

SEARCH_ATTRIBUTES: dict[str, str] = {
    SA_ENV: "Keyword",
    SA_RUN: "Keyword",
    SA_STATUS: "Keyword",
    SA_REWARD: "Double",
    SA_POLICY_VERSION: "Int",
    SA_ENV_FAILURES: "Int",
    SA_TURNS: "Int",
}
"""Name -> Temporal type, in the form `temporal server start-dev --search-attribute Name=Type` takes."""

SIGNAL_TRAJECTORY_FINISHED = "trajectory_finished"
SIGNAL_RESUME_ADMISSION = "resume_admission"
"""Signal a trajectory sends to `TrajectoryRequest.report_to` with a `TrajectoryReport`."""

# Error types (ApplicationError.type) that cross the activity boundary. Infra errors lead to a fresh sandbox
# or a retry; the others end the trajectory as `failed`, never as infra.
ERR_SANDBOX_LOST = "SandboxLost"
ERR_SANDBOX_START = "SandboxStartError"
ERR_ENV = "EnvError"
ERR_POLICY_BEHIND = "PolicyVersionBehind"
ERR_REWARD_REJECTED = "RewardRequestRejected"
ERR_REWARD_BAD_ANSWER = "RewardServiceBadAnswer"
ERR_REWARD_UNAVAILABLE = "RewardServiceUnavailable"
ERR_BAD_REQUEST = "BadRequest"
