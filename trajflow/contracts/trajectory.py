"""Inputs and results of the trajectory workflow and its activities: everything that crosses Temporal.

Every model here is small: text of one turn, references into the object store and scalars. Token ids,
logprobs and whole transcripts live in the store (see `trajflow.contracts.records`), never in workflow history.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, model_validator

from trajflow.contracts import limits
from trajflow.contracts.base import ChatMessage, Contract, FiniteFloat, JsonScalar, ToolCall
from trajflow.contracts.envs import EnvCloseInput as EnvCloseInput
from trajflow.contracts.envs import EnvResetInput as EnvResetInput
from trajflow.contracts.envs import EnvResetResult as EnvResetResult
from trajflow.contracts.envs import EnvStepInput as EnvStepInput
from trajflow.contracts.envs import EnvStepResult
from trajflow.contracts.envs import SandboxHandle as SandboxHandle
from trajflow.contracts.limits import EnvId, EnvKwargs, EnvPackage, Name, PoolName, SystemPrompt, WorkflowIdRef
from trajflow.contracts.reward_models import RewardModelConfig, model_name
from trajflow.contracts.scoring import ScoreRequest

DEFAULT_ENV_ID = "game:GuessTheNumber-v0-easy"
DEFAULT_SYSTEM_PROMPT = (
    "You are playing a game. Answer with your move in the form the game asks for and nothing else.\n\n"
    "Example:\nuser: Guess a number between 1 and 10.\nassistant: \\boxed{5}"
)
"""Shows the answer format by example: without one, SmolLM2-135M-Instruct almost never writes `\\boxed{N}`."""

OBSERVING_REWARD_FNS = frozenset({"guess_narrowing"})
"""Rule rewards that read the episode's observations (`trajflow.rewards.registry`): the workflow sends them these, as
it does a reward model; to every other rule reward it sends none."""


def split_policy(policy: str) -> tuple[str, int | None]:
    """A request's `policy` as (run id, pinned version): `RUN@V` (V decimal digits) pins version V of RUN, which
    the policy store (the engines' weight source) serves instead of the newest; anything else is a run id
    followed to its newest version (pin None). Run ids therefore never contain `@` (`trajflow.client` refuses
    them)."""
    run, at, version = policy.rpartition("@")
    if at and run and version.isascii() and version.isdigit():
        return run, int(version)
    return policy, None


class TrajectoryStatus(StrEnum):
    """How a trajectory ended. Only `completed` trajectories carry a reward and may be trained on."""

    COMPLETED = "completed"
    """The episode ran to its end (env done or the turn limit) and was scored."""
    FAILED = "failed"
    """The environment or the model rejected the episode (an env error, a bad request); not an infra fault."""
    INFRA_FAILED = "infra_failed"
    """Sandboxes or workers kept failing past the recovery budget; never scored, never trained on."""


SEED_BITS = 53
"""Derived seeds are below 2**53: exact as JSON numbers in the Temporal UI (JavaScript doubles)."""


def derive_seed(*parts: int) -> int:
    """A seed in [0, 2**53) from integers (a run seed, a group's env seed, a member index, a turn): the same
    parts give the same seed in every process and Python version (blake2b, not the salted `hash`), and
    different parts give unrelated seeds."""
    digest = hashlib.blake2b(",".join(str(int(p)) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - SEED_BITS)


class SamplingParams(Contract):
    temperature: Annotated[float, Field(ge=0.0, le=5.0)] = 1.0
    """Softmax temperature; 0 means greedy decoding."""
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    """Nucleus sampling mass."""
    max_new_tokens: Annotated[int, Field(ge=1, le=4096)] = 48
    """Token budget of one turn's completion."""
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None
    """Seeds the sampling of one request: the same seed, prompt and weights draw the same tokens, whichever other
    requests share its batch. None: unseeded (the engine's own RNG). In a `TrajectoryRequest` it is the
    trajectory's seed and each turn samples with `derive_seed(seed, turn)` (`for_turn`); a training run sets it
    per member from `[train] seed`."""

    def for_turn(self, turn: int) -> SamplingParams:
        """The params of one turn of a trajectory: its own seed, from the trajectory's and the turn index."""
        return self if self.seed is None else self.model_copy(update={"seed": derive_seed(self.seed, turn)})

    def unseeded(self) -> SamplingParams:
        """The same params without the seed: what requests must share to be sampled in one batch."""
        return self if self.seed is None else self.model_copy(update={"seed": None})


class StagePools(Contract):
    """Which pool (hence task queue) serves each stage of a trajectory: the hardware-affinity map of one task."""

    decode: PoolName = "default"
    env: PoolName = "default"
    reward: PoolName = "default"


class TrajectoryRequest(Contract):
    """One trajectory to run. Every field has a default, so `{}` from the Temporal UI starts the default task."""

    env_id: EnvId = DEFAULT_ENV_ID
    """A GEM environment id (e.g. `game:GuessTheNumber-v0-easy`, an `rg:` reasoning-gym id), `shell:<task>`, a
    user's own env class `py:MODULE:CLASS` or agent program `agent:MODULE:FUNCTION` or `agent-cmd:FILE` (all three with
    `env_package`)."""
    seed: int = 0
    """Seed of the environment's reset; the same seed gives the same episode start."""
    env_kwargs: EnvKwargs = Field(default_factory=dict)
    """Overrides passed to `gem.make` (e.g. `{"max_turns": 20}`), or to a user env class."""
    env_package: EnvPackage = ""
    """A `py:MODULE:CLASS` env's or `agent:`/`agent-cmd:` program's packed source (a `data:NAME` task's file): its
    object-store URI, set when the run or rollout is submitted (`trajflow/sandbox/user/`); empty for every other
    kind."""
    max_turns: Annotated[int, Field(ge=1, le=200)] = 8
    """Turn limit on our side; the episode ends as completed (truncated) when it is reached."""
    max_context_tokens: limits.ContextBudget = None
    """The episode's context budget: prompt plus new tokens of a turn stay within it and the model's positions
    (whichever is smaller; None: the model's). A turn's new tokens are cut to what is left, and a turn whose prompt
    leaves no room ends the episode as completed (truncated), scored by its reward rule like any other."""
    system_prompt: SystemPrompt = DEFAULT_SYSTEM_PROMPT
    """First chat message; empty means the model's chat template default."""
    sampling: SamplingParams = SamplingParams()
    pools: StagePools = StagePools()
    reward_fn: Name = "env_outcome"
    """Name of a reward function registered in the reward service, or `model:NAME` for a reward model (with
    `reward_model`)."""
    reward_model: RewardModelConfig | None = None
    """The reward model of `reward_fn = "model:NAME"` (`trajflow.contracts.reward_models`), filled in from the run
    config's `[reward_models.NAME]` by `TaskConfig.request`; None for rule rewards."""
    run_id: WorkflowIdRef = ""
    """The training run this trajectory belongs to (empty for a standalone rollout). With `report_to` unset,
    the trajectory reports to the run's training workflow (whose workflow id is the run id)."""
    policy: WorkflowIdRef = ""
    """Whose weights generate: a training run id (its newest published version), `RUN@V` for exactly version V
    of that run (`trajflow eval` pins the version it evaluates; see `split_policy`), or empty for the initial
    model. The training workflow sets it to its run id."""
    group: WorkflowIdRef = ""
    """Group id (GRPO: samples of one prompt); free-form here."""
    min_policy_version: Annotated[int, Field(ge=0)] = 0
    """The decode pool must serve at least this policy version."""
    max_env_recoveries: Annotated[int, Field(ge=0, le=20)] = 2
    """Fresh sandboxes restored by action replay before the trajectory is infra-failed."""
    report_to: WorkflowIdRef | None = None
    """Workflow id to signal with a `TrajectoryReport` at the end; None: the run's training workflow when
    `run_id` is set, else nobody."""
    task: Name = ""
    """The task's name in the run config (`TaskConfig.name`), for listing and filtering; empty when unknown."""
    replay_of: WorkflowIdRef = ""
    """Set by `trajflow replay`: the workflow id this trajectory re-runs. A replay reports to nobody (neither
    `report_to` nor the run), so a training run never counts or trains on it."""
    branch_of: WorkflowIdRef = ""
    """Set by `trajflow branch`: the parent trajectory's workflow id. The branch takes the episode (env, seeds,
    prompt, turn limit, reward, sampling but its seed, task) from the parent's record, replays its turns before
    `branch_turn` and samples from there (`trajflow.contracts.branches`)."""
    branch_turn: Annotated[int, Field(ge=0, le=200)] = 0
    """A branch's first sampled turn k (1-based; 1 restarts the episode reusing nothing); 0 when not a branch."""
    branch_record: Annotated[str, Field(max_length=2048)] = ""
    """A branch's parent record URI; empty: the one record in the store under the parent's workflow id."""
    branch_index: Annotated[int, Field(ge=0, lt=2**31)] = 0
    """Which of a parent's branches at a turn this is: its sampling seed derives from it (branches differ)."""

    @model_validator(mode="after")
    def _reward_model_spec(self) -> TrajectoryRequest:
        """`model:NAME` carries its spec, a rule reward none: checked at the start, not after the whole episode."""
        name = model_name(self.reward_fn)
        if name is not None and self.reward_model is None:
            raise ValueError(
                f"reward_fn {self.reward_fn!r} needs the model's spec in reward_model (a run config's "
                f"[reward_models.{name}]; trajflow fills it in from the config)"
            )
        if name is None and self.reward_model is not None:
            raise ValueError(f"reward_model is set but reward_fn {self.reward_fn!r} is not model:NAME")
        if self.branch_of and self.branch_turn < 1:
            raise ValueError("branch_of is set: branch_turn must be the turn to sample from, at least 1")
        if not self.branch_of and (self.branch_turn or self.branch_record or self.branch_index):
            raise ValueError("branch_turn, branch_record and branch_index need branch_of (the parent's workflow id)")
        return self

    def report_target(self) -> str | None:
        if self.replay_of:
            return None
        return self.report_to or self.run_id or None

    def generate_input(self, trajectory_id: str, turn: int, context_uri: str | None, observation: str) -> GenerateInput:
        """The LLM step of `turn`: the new observation on top of the stored context, with this request's
        prompt, sampling (seeded per turn when the request is) and policy."""
        return GenerateInput(
            trajectory_id=trajectory_id,
            turn=turn,
            context_uri=context_uri,
            user_message=observation,
            system_prompt=self.system_prompt,
            sampling=self.sampling.for_turn(turn),
            min_policy_version=self.min_policy_version,
            policy=self.policy,
            max_context_tokens=self.max_context_tokens,
        )

    def score_request(
        self,
        actions: list[str],
        env_rewards: list[float],
        terminated: bool,
        truncated: bool,
        final_info: dict,
        observations: list[str] | None = None,
    ) -> ScoreRequest:
        """What the reward service scores: the episode's actions, env rewards and how it ended; with a reward model,
        also the spec and the env's observations (a judge reads the task from them; a rule reward does not, so
        they are left out of its payload, except for the few in `OBSERVING_REWARD_FNS` that read the game's text)."""
        observing = self.reward_model is not None or self.reward_fn in OBSERVING_REWARD_FNS
        return ScoreRequest(
            reward_fn=self.reward_fn,
            reward_model=self.reward_model,
            observations=list(observations or []) if observing else [],
            env_id=self.env_id,
            seed=self.seed,
            actions=actions,
            env_rewards=env_rewards,
            terminated=terminated,
            truncated=truncated,
            final_info=final_info,
        )


class GenerateInput(Contract):
    trajectory_id: str
    turn: int
    context_uri: str | None
    """The previous turn's context in the store: its newest delta, linked to the ones before (None on the first
    turn)."""
    user_message: str
    """The new observation, appended to the context as a user message."""
    messages: list[ChatMessage] | None = None
    """An agent's turn (`agent:` envs): its request's whole conversation, in place of `user_message` and
    `system_prompt`; it must extend the context (`trajflow.rl.chat.append_messages`)."""
    tools: list[dict[str, Any]] | None = None
    """An agent's request's tools (OpenAI format): rendered by the model's chat template, the completion's tool calls
    parsed (`trajflow.rl.tool_calls`)."""
    stop: list[str] | None = None
    """An agent's request's stop sequences: the answer ends before the first (`trajflow.rl.stops`)."""
    system_prompt: str = ""
    sampling: SamplingParams = SamplingParams()
    min_policy_version: int = 0
    policy: str = ""
    """Whose weights: a training run id, or empty for the initial model."""
    max_context_tokens: limits.ContextBudget = None
    """The episode's context budget (`TrajectoryRequest.max_context_tokens`), within the engine's positions."""


class GenerateResult(Contract):
    text: str
    """The completion's text (with `tools`: without its tool calls)."""
    context_uri: str
    """The updated context: what this turn added to it (token ids, logprobs, loss mask, version), stored as a delta
    linked to the previous turn's, so the whole context so far can be read back from it."""
    prompt_tokens: int
    completion_tokens: int
    policy_version: int
    finish_reason: str
    pool: str
    worker_id: str
    tool_calls: list[ToolCall] | None = None
    """The tool calls parsed from the completion (a request with `tools`; finish reason `tool_calls`)."""


class TurnSummary(Contract):
    """One turn as history keeps it: the action and observation text and scalars."""

    action: str
    observation: str
    env_reward: float
    policy_version: int
    completion_tokens: int
    decode_pool: str
    decode_worker: str = ""
    """The decode worker that generated the action (`host-pid-random`: a pool may have several replicas); empty in
    records written before it was kept."""
    sent: str = ""
    """What an agent env was sent: the answer whole (text or tool calls, finish reason, token counts), which a replay or
    a branch sends again; empty for other envs (they were sent `action`) and in records written before it was kept."""

    @classmethod
    def of(cls, gen: GenerateResult, step: EnvStepResult, action: str | None = None, sent: str = "") -> TurnSummary:
        """`action` when the env was sent other than the completion's text (an agent's answer with tool calls);
        `sent`, an agent's answer as sent."""
        return cls(
            action=gen.text if action is None else action,
            sent=sent,
            observation=step.observation,
            env_reward=step.reward,
            policy_version=gen.policy_version,
            completion_tokens=gen.completion_tokens,
            decode_pool=gen.pool,
            decode_worker=gen.worker_id,
        )


class SaveTrajectoryInput(Contract):
    workflow_id: str
    request: TrajectoryRequest
    status: TrajectoryStatus
    context_uri: str | None
    first_observation: str
    turns: list[TurnSummary]
    reward: float | None
    reward_details: dict[str, JsonScalar] = Field(default_factory=dict)
    env_recoveries: int
    error: str | None = None
    timings: dict[str, float] = Field(default_factory=dict)
    context_full: bool = False
    """The episode ended because its next prompt filled the context budget (`max_context_tokens`)."""


class SaveTrajectoryResult(Contract):
    trajectory_uri: str


class TrajectoryResult(Contract):
    workflow_id: str
    status: TrajectoryStatus
    turns: int
    reward: float | None
    """None unless completed: an infra failure is never a zero reward."""
    trajectory_uri: str | None
    policy_version: int | None
    """The oldest policy version among the turns (None if no turn was generated)."""
    env_recoveries: int
    error: str | None = None
    seconds: float = 0.0
    won: bool = False
    """Completed, and its last env reward was at least 1: what eval calls a win (False in histories from before
    this field)."""

    def report(self, group: str) -> TrajectoryReport:
        """The signal this trajectory, a member of `group`, sends (or its run files for it) when it ends."""
        return TrajectoryReport(
            workflow_id=self.workflow_id,
            trajectory_uri=self.trajectory_uri,
            group=group,
            policy_version=self.policy_version,
            reward=self.reward,
            status=self.status,
            error=self.error,
            won=self.won,
            turns=self.turns,
        )


class TrajectoryProgress(Contract):
    """What the TrajectoryWorkflow's `progress` query answers: where a running episode is."""

    env_id: str
    max_turns: int
    turn: int
    """Turns done so far."""
    sandbox: str | None
    """The sandbox's id while one is open."""
    host_queue: str | None
    """The env worker's own queue that the sandbox's steps go to, while one is open."""
    env_recoveries: int
    last_observation: str
    """The end (at most 2000 characters) of the newest observation."""


class TrajectoryReport(Contract):
    """The small signal a trajectory sends to `report_to` when it ends."""

    workflow_id: str
    trajectory_uri: str | None
    group: str
    policy_version: int | None
    reward: FiniteFloat | None
    status: TrajectoryStatus
    error: str | None = None
    """Why it failed, when it did (the training workflow names it when it stops admission)."""
    won: bool = False
    """Completed, and its last env reward was at least 1 (what eval calls a win); False from older trajectories."""
    turns: int = 0
    """Its turns (a tree rollout draws its branches' turns from them); 0 from older trajectories."""

    @classmethod
    def infra_failed(cls, workflow_id: str, group: str, error: str) -> TrajectoryReport:
        """The report filed for a member that ended without one (terminated, failed, timed out, never started):
        an infra failure, never scored."""
        return cls(
            workflow_id=workflow_id,
            trajectory_uri=None,
            group=group,
            policy_version=None,
            reward=None,
            status=TrajectoryStatus.INFRA_FAILED,
            error=error,
        )
