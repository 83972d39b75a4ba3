"""Branching a recorded trajectory at turn k: what the branch takes from its parent, and the parent's prefix.

A branch is a `TrajectoryWorkflow` of its own whose request has `branch_of` (the parent's workflow id) and
`branch_turn` k (1-based). It starts from the parent's turns 1..k-1 and samples from turn k on:

- **From the parent's record** (the episode): env_id, env_kwargs, env_package, seed, task, max_turns, system_prompt,
  reward_fn, reward_model, and sampling's temperature, top_p and max_new_tokens.
- **From the branch's own request** (the sample): the sampling seed (when the branch sets one; else derived from
  the parent's id and sampling seed, k and `branch_index`, so that m branches differ and a branch re-run with the
  same index samples the same), policy, min_policy_version, run_id, group, report_to, replay_of, pools,
  max_env_recoveries and the branch fields themselves.

So `{"branch_of": "ID", "branch_turn": 2}` from the Temporal UI is a whole branch request (its pools must be where
the parent's record can be read: the default pool unless given; `trajflow.client.start_branches` copies the
parent's). Turn k's observation is the parent's; the branch's env is restored by replaying actions 1..k-1 into a
fresh sandbox and must show that very observation (else the env is not deterministic and the branch ends `failed`).

An agent env's branch (`agent:`, `agent-cmd:`) re-runs the program in a fresh sandbox with its first k-1 calls
answered as the parent's were (`TurnSummary.sent`: text, tool calls, finish reason, token counts); each must ask what
the parent's asked (its digest), and its call k is the parent's, which the branch answers with a new sample.

Limits: the parent must have a saved record (any status) with at least k-1 turns, and k must be at most its
`max_turns`; an agent parent recorded before its answers were kept whole (`sent` empty) is refused.
"""

from __future__ import annotations

import hashlib

from trajflow.contracts.agent import is_agent
from trajflow.contracts.base import Contract
from trajflow.contracts.records import TrajectoryRecord, TurnContext
from trajflow.contracts.trajectory import TrajectoryRequest, TurnSummary, derive_seed

BRANCH_SALT = 0x6272616E6368
"""Mixed into derived branch seeds ("branch"), so they never equal a turn seed of the parent."""


class BranchRefused(ValueError):
    """The parent cannot be branched at that turn (no record, too few turns, an agent env...): not retried."""


class BranchInput(Contract):
    """`trajectory.branch`: load the parent's record and write its context cut at the end of turn k-1."""

    parent: str
    """The parent's workflow id."""
    record_uri: str = ""
    """The parent's record; empty: the one record stored under the parent's workflow id."""
    turn: int
    """k, 1-based: the branch samples from turn k."""
    trajectory_id: str
    """The branch's `<workflow id>/<run id>`: where its starting context is written."""


class BranchPrefix(Contract):
    """What a branch reuses of its parent: turns 1..k-1 and where turn k starts."""

    request: TrajectoryRequest
    """The parent's request (the episode's fields come from it: `branch_request`)."""
    record_uri: str
    first_observation: str
    turns: list[TurnSummary]
    """The parent's turns 1..k-1."""
    actions: list[str]
    """Their actions, replayed into the branch's fresh sandbox."""
    observation: str
    """The parent's observation at turn k (the first observation when k = 1): the restored env must show it."""
    context_uri: str | None = None
    """The parent's token context cut at the end of turn k-1, written for the branch (None when k = 1)."""


def _text_int(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def branch_seed(branch: TrajectoryRequest, parent: TrajectoryRequest) -> int:
    """The branch's sampling seed: its own when set, else one derived from the parent's id and sampling seed, k and
    the branch index (the same inputs give the same seed: re-running branch i samples what it sampled before)."""
    if branch.sampling.seed is not None:
        return branch.sampling.seed
    parent_seed = parent.sampling.seed if parent.sampling.seed is not None else parent.seed
    return derive_seed(BRANCH_SALT, _text_int(branch.branch_of), parent_seed, branch.branch_turn, branch.branch_index)


def branch_request(branch: TrajectoryRequest, parent: TrajectoryRequest) -> TrajectoryRequest:
    """The request a branch runs with: the parent's episode, the branch's sample (see the module's docstring)."""
    sampling = parent.sampling.model_copy(update={"seed": branch_seed(branch, parent)})
    own = (
        "pools",
        "run_id",
        "policy",
        "group",
        "min_policy_version",
        "report_to",
        "replay_of",
        "max_env_recoveries",
        "branch_of",
        "branch_turn",
        "branch_record",
        "branch_index",
    )
    return parent.model_copy(update={"sampling": sampling, **{f: getattr(branch, f) for f in own}})


def cut_context(ctx: TurnContext, turns: int) -> TurnContext | None:
    """`ctx` as it was at the end of its turn `turns`'s completion (None for 0 turns): messages through that turn's
    assistant message, tokens, logprobs and mask through the end of its span, its first `turns` versions and spans."""
    if turns == 0:
        return None
    if len(ctx.turn_spans) < turns or len(ctx.turn_versions) < turns:
        raise BranchRefused(f"the parent's context holds {len(ctx.turn_spans)} turns, fewer than {turns}")
    end = ctx.turn_spans[turns - 1][1]
    assistants = [i for i, m in enumerate(ctx.messages) if m.role == "assistant"]
    if len(assistants) < turns:
        raise BranchRefused(f"the parent's context holds {len(assistants)} assistant messages, fewer than {turns}")
    return TurnContext(
        messages=ctx.messages[: assistants[turns - 1] + 1],
        token_ids=ctx.token_ids[:end],
        logprobs=ctx.logprobs[:end],
        loss_mask=ctx.loss_mask[:end],
        turn_versions=ctx.turn_versions[:turns],
        turn_spans=ctx.turn_spans[:turns],
        model=ctx.model,
    )


def check_branchable(record: TrajectoryRecord, turn: int) -> None:
    """Raise BranchRefused, saying why, unless `record` can be branched at `turn` (1-based)."""
    req, have = record.request, len(record.turns)
    if is_agent(req.env_id) and not all(t.sent for t in record.turns[: turn - 1]):
        raise BranchRefused(
            f"{record.workflow_id} runs an agent program ({req.env_id}) and its record predates the answers kept whole "
            "(what its program was sent): it cannot be branched"
        )
    if turn < 1 or turn > req.max_turns:
        raise BranchRefused(f"turn {turn} is out of range: {record.workflow_id} has max_turns {req.max_turns}")
    if have < turn - 1:
        raise BranchRefused(f"{record.workflow_id} recorded {have} turns: branching at turn {turn} needs {turn - 1}")
    if turn > 1 and record.context is None:
        raise BranchRefused(f"{record.workflow_id}'s record has no token context to reuse")


def prefix_of(record: TrajectoryRecord, turn: int, record_uri: str) -> tuple[BranchPrefix, TurnContext | None]:
    """The prefix a branch at `turn` reuses, and the parent's context cut at the end of turn `turn`-1."""
    check_branchable(record, turn)
    turns = record.turns[: turn - 1]
    context = cut_context(record.context, turn - 1) if record.context is not None else None
    prefix = BranchPrefix(
        request=record.request,
        record_uri=record_uri,
        first_observation=record.first_observation,
        turns=turns,
        actions=[t.sent or t.action for t in turns],
        observation=turns[-1].observation if turns else record.first_observation,
    )
    return prefix, context
