"""Decode activity: one LLM turn of one trajectory, batched with every other trajectory's turn by the engine.

Every decode worker (a pool may have several replicas polling its queue) follows the published policy itself: it
answers a request that needs version v only with weights of v or newer, else the activity fails retryably
(`ERR_POLICY_BEHIND`) and the turn is tried again, on this worker or another.

Loads the trajectory's token-level context (from this worker's memory, else from the store), appends the new
observation (chat formatting on our side; an agent's turn brings its whole conversation, which must extend the
context, else `AgentContextMismatch`, not retried; its tools are rendered by the model's chat template, one without
tools fails the trajectory, `BadRequest`), generates (with tools: the completion's tool calls parsed out of its
text; with stop sequences: the answer ended before the first, `trajflow.rl.stops`), stores what this turn added to
the context (a delta linked to the previous turn's: `trajflow.activities.contexts`) and returns the text, the delta's
URI and the policy version.

An engine that talks to a server raises `EngineError`s, mapped here once: unavailable is retried (past the retry
budget the trajectory is infra-failed), a rejected request fails the trajectory (`BadRequest`), a misconfigured
server fails the activity at once without blaming the trajectory (infra-failed, never scored).

Context budget: prompt plus new tokens stay within the smaller of the request's `max_context_tokens` and the engine's
positions (`Engine.max_positions`). A turn's `max_new_tokens` is cut to the room left; a prompt that leaves no room
generates nothing and answers `finish_reason = "context_full"` (`trajflow.contracts.engines.CONTEXT_FULL`), with the
context unchanged: the workflow ends the episode there, completed and truncated, and scores it.

`llm.describe` answers what this worker's engine is (`EngineInfo`): whether it follows training, its positions.
"""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.exceptions import ApplicationError

from trajflow.activities.contexts import ContextStore
from trajflow.activities.heartbeats import with_heartbeats
from trajflow.contracts import metrics, names
from trajflow.contracts.engines import CONTEXT_FULL, EngineInfo
from trajflow.contracts.records import TurnContext
from trajflow.contracts.trajectory import GenerateInput, GenerateResult
from trajflow.infra.layout import context_key
from trajflow.infra.store import ObjectStore
from trajflow.observability.metrics import record
from trajflow.rl.chat import ContextMismatch, append_completion, append_messages, append_user
from trajflow.rl.engines.base import Completion, Engine, EngineMisconfigured, EngineRequestRejected, EngineUnavailable
from trajflow.rl.stops import cut_at_stop
from trajflow.rl.tool_calls import ToolsUnsupported, parse_tool_calls

HEARTBEAT_EVERY_S = 5.0
"""Below a fifth of the heartbeat timeout in workflows/stubs.py."""


class DecodeActivities:
    def __init__(self, engine: Engine, store: ObjectStore, pool: str, worker_id: str) -> None:
        self.engine = engine
        self.store = store
        self.pool = pool
        self.worker_id = worker_id
        self.contexts = ContextStore(store)

    @activity.defn(name=names.LLM_DESCRIBE)
    async def describe(self) -> EngineInfo:
        return EngineInfo(
            name=self.engine.name,
            follows_training=self.engine.follows_training,
            version=self.engine.version,
            max_positions=self.engine.max_positions,
            worker_id=self.worker_id,
            pool=self.pool,
        )

    @activity.defn(name=names.LLM_GENERATE)
    async def generate(self, inp: GenerateInput) -> GenerateResult:
        available = await asyncio.to_thread(self.engine.available_version, inp.policy)
        if available < inp.min_policy_version:
            # Retryable: the trainer publishes the version soon (the workflow admitted this request at it).
            raise ApplicationError(
                f"policy {inp.policy!r} is published up to v{available}, the request needs "
                f"v{inp.min_policy_version} or newer",
                type=names.ERR_POLICY_BEHIND,
            )
        before = TurnContext(model=self.engine.name)
        if inp.context_uri:
            before = await asyncio.to_thread(self.contexts.load, inp.context_uri)
        if inp.messages is None:
            ctx, prompt_ids = append_user(before, self.engine.tokenizer, inp.user_message, inp.system_prompt)
        else:  # an agent's turn: its whole conversation, which must extend the context
            try:
                ctx, prompt_ids = append_messages(before, self.engine.tokenizer, inp.messages, inp.tools)
            except ContextMismatch as e:
                raise ApplicationError(str(e), type=names.ERR_CONTEXT_MISMATCH, non_retryable=True) from e
            except ToolsUnsupported as e:  # the trajectory's request: it fails, it is not an infra failure
                raise ApplicationError(str(e), type=names.ERR_BAD_REQUEST, non_retryable=True) from e
        room = context_room(len(prompt_ids), inp.max_context_tokens, self.engine.max_positions)
        if room is not None and room < 1:
            return GenerateResult(
                text="",
                context_uri=inp.context_uri or "",
                prompt_tokens=len(prompt_ids),
                completion_tokens=0,
                policy_version=available,
                finish_reason=CONTEXT_FULL,
                pool=self.pool,
                worker_id=self.worker_id,
            )
        sampling = inp.sampling
        if room is not None and room < sampling.max_new_tokens:
            sampling = sampling.model_copy(update={"max_new_tokens": room})
        try:
            completion = await with_heartbeats(
                self.engine.generate(prompt_ids, sampling, inp.policy), "generating", HEARTBEAT_EVERY_S
            )
        except EngineUnavailable as e:
            raise ApplicationError(str(e), type=names.ERR_ENGINE_UNAVAILABLE) from e
        except EngineRequestRejected as e:  # the trajectory's request: it fails, it is not an infra failure
            raise ApplicationError(str(e), type=names.ERR_BAD_REQUEST, non_retryable=True) from e
        except EngineMisconfigured as e:
            raise ApplicationError(str(e), type=names.ERR_ENGINE_MISCONFIGURED, non_retryable=True) from e
        version = completion.policy_version  # the oldest, when the turn spans several (`Completion.versions`)
        if version < inp.min_policy_version:
            # The engine reloads between batches from the store's pointer, so this needs a pointer that went back (a
            # store restored from a backup); retried like a version not yet published, never served as older weights.
            raise ApplicationError(
                f"the engine generated with v{version} of {inp.policy!r}, the request needs v{inp.min_policy_version}",
                type=names.ERR_POLICY_BEHIND,
            )
        _record_completion(completion)
        ids, logprobs = completion.token_ids, completion.logprobs
        text, calls, finish_reason = completion.text, None, completion.finish_reason
        if inp.stop and (cut := cut_at_stop(self.engine.tokenizer, ids, logprobs, text, inp.stop)) is not None:
            (ids, logprobs, text), finish_reason = cut, "stop"  # the answer ends before the stop string
        if inp.tools:  # the answer as the program reads it: text and tool calls (the tokens stay as sampled)
            text, parsed = parse_tool_calls(text, inp.turn)
            calls, finish_reason = parsed or None, "tool_calls" if parsed else finish_reason
        ctx = append_completion(ctx, ids, logprobs, text, version, calls)
        key = context_key(inp.trajectory_id, inp.turn, activity.info().attempt)
        uri = await asyncio.to_thread(self.contexts.save, key, inp.context_uri, before, ctx)
        return GenerateResult(
            text=text,
            context_uri=uri,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(ids),
            policy_version=version,
            finish_reason=finish_reason,
            pool=self.pool,
            worker_id=self.worker_id,
            tool_calls=calls,
        )


def context_room(prompt_tokens: int, budget: int | None, positions: int | None) -> int | None:
    """How many new tokens a turn with `prompt_tokens` may generate within the context budget and the engine's
    positions (the smaller; None: no limit known)."""
    limits = [limit for limit in (budget, positions) if limit is not None]
    return min(limits) - prompt_tokens if limits else None


def _record_completion(completion: Completion) -> None:
    """The decode metrics of one request: its tokens, and what the engine says of its batch and queue."""
    meter = activity.metric_meter()
    record(meter, metrics.DECODE_TOKENS, len(completion.token_ids))
    if completion.batch_requests:
        record(meter, metrics.DECODE_BATCH_REQUESTS, completion.batch_requests)
    if completion.queue_wait_s is not None:
        record(meter, metrics.DECODE_QUEUE_WAIT_SECONDS, completion.queue_wait_s)
    if completion.batch_tokens_per_s is not None:
        record(meter, metrics.DECODE_TOKENS_PER_S, completion.batch_tokens_per_s)
