"""Names shared by every process: task queues, activity and workflow names, search attributes.

One queue per pool and stage; stateful follow-ups go to a worker's own host queue. Nothing here does I/O.
"""

from __future__ import annotations

WORKFLOW_QUEUE = "trajflow"
"""The orchestrator's queue: every workflow (trajectories, later training runs) is started here."""

TRAJECTORY_WORKFLOW = "TrajectoryWorkflow"
TRAINING_WORKFLOW = "TrainingWorkflow"
REPLAY_ENV_WORKFLOW = "ReplayEnvWorkflow"
SHARD_WORKFLOW = "ShardWorkflow"
"""Re-drives a fresh sandbox with a trajectory's recorded actions, no LLM (`trajflow replay --env-only`)."""

ENV_RESET = "env.reset"
ENV_STEP = "env.step"
ENV_CLOSE = "env.close"
LLM_GENERATE = "llm.generate"
LLM_DESCRIBE = "llm.describe"
"""What a decode pool's engine is (`EngineInfo`): a training run asks each of its decode pools before it starts."""
REWARD_SCORE = "reward.score"
TRAJECTORY_SAVE = "trajectory.save"
TRAJECTORY_BRANCH = "trajectory.branch"
"""Loads a branch's parent record and writes its cut context (reward pool, beside `trajectory.save`)."""
GROUP_SAVE = "training.save_group"
"""Writes a sharded run's complete group (`GroupManifest`) to the store (reward pool, beside `trajectory.save`)."""
TRAIN_STEP = "trainer.train_step"
WATCH_CHILDREN = "training.watch_children"
"""Waits until some of the trajectories a training run inherited through continue-as-new have closed (orchestrator
worker, on the workflow's own queue)."""


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


# Custom search attributes: registered by `trajflow up` and the test server, kept current by the workflow.
SA_ENV = "TrajflowEnv"
SA_RUN = "TrajflowRun"
SA_STATUS = "TrajflowStatus"
SA_REWARD = "TrajflowReward"
SA_POLICY_VERSION = "TrajflowPolicyVersion"
SA_ENV_FAILURES = "TrajflowEnvFailures"
SA_TURNS = "TrajflowTurns"
SA_TASK = "TrajflowTask"
SA_REPLAY_OF = "TrajflowReplayOf"
SA_BRANCH_OF = "TrajflowBranchOf"
"""A branch's parent workflow id (`trajflow branch`)."""
SA_BRANCH_TURN = "TrajflowBranchTurn"
"""The turn (1-based) a branch samples from; turns before it are its parent's. A Double holding a whole number: the
dev server (SQLite visibility) allows 3 Int attributes and trajflow's three are taken; a Double still compares as a
number (`TrajflowBranchTurn >= 2`)."""

LABEL_SANDBOX = "trajflow.sandbox"
"""The Docker label every sandbox container carries (`trajflow.sandbox.labels`), so whoever stops a host's workers
(`trajflow.infra.host_admin`) finds the sandboxes they owned."""
LABEL_OWNER_HOST = "trajflow.owner_host"
"""The Docker label naming the host (`TRAJFLOW_HOST_NAME`) of the env worker that owns a sandbox."""

SEARCH_ATTRIBUTES: dict[str, str] = {
    SA_ENV: "Keyword",
    SA_RUN: "Keyword",
    SA_STATUS: "Keyword",
    SA_REWARD: "Double",
    SA_POLICY_VERSION: "Int",
    SA_ENV_FAILURES: "Int",
    SA_TURNS: "Int",
    SA_TASK: "Keyword",
    SA_REPLAY_OF: "Keyword",
    SA_BRANCH_OF: "Keyword",
    SA_BRANCH_TURN: "Double",
}
"""Name -> Temporal type, in the form `temporal server start-dev --search-attribute Name=Type` takes. The dev
server's SQL visibility allows at most 3 custom Int attributes (all used) and 10 Keyword ones. A server started
before an attribute was added here gets it from `trajflow.infra.temporal.ensure_search_attributes` (run by `trajflow
up`)."""

# Query and signal names: the workflows' decorators and every client use these, never the strings themselves.
QUERY_PROGRESS = "progress"
"""Every workflow's live view: `TrajectoryProgress` (TrajectoryWorkflow), `TrainingProgress` (TrainingWorkflow),
`EnvReplayResult` so far (ReplayEnvWorkflow)."""
QUERY_STATE = "state"
"""The TrainingWorkflow's whole `TrainingState` (what it carries through continue-as-new)."""
SIGNAL_TRAJECTORY_FINISHED = "trajectory_finished"
"""Signal a trajectory sends to `TrajectoryRequest.report_to` with a `TrajectoryReport`."""
SIGNAL_GROUP_FINISHED = "group_finished"
"""Signal a ShardWorkflow sends its training run with a `GroupReport` when one of its groups ended."""
SIGNAL_SHARD_FINISHED = "shard_finished"
"""A ShardWorkflow's last signal to its training run (`ShardDone`)."""
SIGNAL_RESUME_ADMISSION = "resume_admission"
"""Tells a TrainingWorkflow whose admission paused (a run of infra failures) to admit again; no argument."""
SIGNAL_CONTINUE_AS_NEW = "continue_as_new"
"""Asks a TrainingWorkflow to continue as new at once, from wherever it waits (its whole state carries over)."""
SIGNAL_STOP = "stop"
"""Ends a TrainingWorkflow early with a `StopRequest` (`trajflow stop RUN`): no more admission, the current step
trained, every trajectory still running cancelled, the result marked stopped."""
QUERY_RUN_CONFIG = "run_config"
"""The TrainingWorkflow's `TrainingRunConfig` (what `trajflow attach` evaluates with)."""

# Error types (ApplicationError.type) that cross the activity boundary. Infra errors lead to a fresh sandbox
# or a retry; the others end the trajectory as `failed`, never as infra.
ERR_SANDBOX_LOST = "SandboxLost"
ERR_SANDBOX_START = "SandboxStartError"
ERR_ENV = "EnvError"
ERR_POLICY_BEHIND = "PolicyVersionBehind"
ERR_REWARD_REJECTED = "RewardRequestRejected"
ERR_REWARD_BAD_ANSWER = "RewardServiceBadAnswer"
ERR_REWARD_UNAVAILABLE = "RewardServiceUnavailable"
ERR_VERIFIER_TIMEOUT = "VerifierTimedOut"
"""A verifier (a bounded reward function: `math_verify`, a user's own) ran past the reward service's time limit and
its worker was killed (`trajflow.rewards.bounded`). Not retried (the same answer would time out again), never scored:
the trajectory ends `failed` — the answer (or the user's function), not the infrastructure, is at fault."""
ERR_ENGINE_UNAVAILABLE = "EngineUnavailable"
"""A decode engine's server could not be reached or failed on its side: retried."""
ERR_ENGINE_MISCONFIGURED = "EngineMisconfigured"
"""A decode engine's server cannot serve it as configured (auth, model name, missing logprobs): not retried,
and the trajectory ends infra-failed, never scored."""
ERR_BAD_REQUEST = "BadRequest"
ERR_CONTEXT_MISMATCH = "AgentContextMismatch"
"""An agent's request (`GenerateInput.messages`) does not extend its trajectory's context: the program rewrote its
history (`trajflow.rl.chat.ContextMismatch` says where). Not retried; the turn is never trained on re-tokenised."""
ERR_AGENT = "AgentError"
"""An agent program failed (`trajflow.envs.agent`: crashed, hung, malformed_request, bad_result; the message starts
with the kind): not retried, and the trajectory ends infra-failed at once (a fresh sandbox would fail the same way)."""
ERR_AGENT_NONDETERMINISTIC = "AgentNonDeterministic"
"""An agent program re-run in a fresh sandbox asked something else than its recorded request: it cannot be restored
by replay. Not retried; the trajectory ends infra-failed."""
ERR_TRAINER_RANKS = "TrainerRanksBroken"
"""A step broke a launched trainer's rank group (a rank died): retried once the launcher has restarted the ranks."""
ERR_INVALID_INPUT = "InvalidWorkflowInput"
"""A workflow started (from the UI, the CLI or a client) with input that does not validate: the workflow fails,
non-retryably, with a message naming each bad field (`trajflow.workflows.inputs`)."""
ERR_PAYLOADS_TOO_LARGE = "PayloadsTooLarge"
"""A payload over Temporal's blob limit: the SDK's type for an activity result it could not upload, and ours for
an activity input the workflow stubs refuse to schedule (`trajflow.contracts.limits.MAX_PAYLOAD_BYTES`). Never
retried."""
