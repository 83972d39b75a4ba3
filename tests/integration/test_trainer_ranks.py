"""The trainer worker under `accelerate launch` with two CPU processes (gloo), against the real Temporal dev server:

- steps trained by two ranks publish the same weights (and the same loss and gradient norm) as one process
  training on the same batches: the gradients are all-reduced and the loss is normalised over the whole batch,
  not per rank; a second launch resumes both ranks from the store's checkpoint and trains on identically;
- a rank SIGKILLed in the middle of a training run (`TrainingWorkflow`, real trajectories in Docker sandboxes)
  breaks the group; the launcher restarts both ranks, the step is retried, resumes from the store's checkpoint
  and the run finishes with every step published once.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import uuid
from pathlib import Path

import pytest
import torch
from pydantic import BaseModel
from safetensors.torch import load_file
from temporalio import workflow
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.conftest import ROOT, pending_work, wait_for
from tests.integration.launched_trainer import LaunchedTrainer
from trajflow.contracts import names
from trajflow.contracts.records import TrajectoryRecord, TurnContext
from trajflow.contracts.training import LoraConfig, LossConfig, TrainerConfig, TrainRef, TrainStepInput, TrainStepResult
from trajflow.contracts.trajectory import SamplingParams, TrajectoryRequest, TrajectoryStatus
from trajflow.infra.layout import policy_version_prefix
from trajflow.infra.policies import get_dir
from trajflow.infra.store import LocalStore

pytestmark = pytest.mark.integration

CONFIG = TrainerConfig(
    lr=1e-3, micro_batch=2, autocast="off", loss=LossConfig(kind="ppo_clip", aggregation="token_mean")
)
"""float32 everywhere (no bf16 autocast, whatever the CPU), so the two runs may differ only by summation order."""


def float32_config(tmp_path: Path) -> Path:
    """trajflow/configs/tiny.toml with decode weights forced to float32: the trainer publishes in decode's dtype, which
    "auto" makes bfloat16 on a CPU with native bf16, and one bf16 rounding step (2**-8 relative) of a weight is far more
    than the summation-order noise this test bounds. Publishing in float32 keeps the comparison exact on every CPU."""
    path = tmp_path / "tiny-float32.toml"
    text = (ROOT / "trajflow" / "configs" / "tiny.toml").read_text()
    forced = text.replace('name_or_path = "tiny"\n', 'name_or_path = "tiny"\ndtype = "float32"\n', 1)
    assert forced != text, "trajflow/configs/tiny.toml changed: set the dtype another way"
    path.write_text(forced)
    return path


class StepsInput(BaseModel):
    pool: str
    steps: list[TrainStepInput]


@workflow.defn(sandboxed=False)
class TrainSteps:
    """The optimizer steps of a run, one after another, as the TrainingWorkflow issues them."""

    @workflow.run
    async def run(self, inp: StepsInput) -> list[TrainStepResult]:
        from trajflow.workflows import stubs

        return [await stubs.train_step(inp.pool, step) for step in inp.steps]


def records(rng: random.Random, count: int, vocab: int) -> list[TrajectoryRecord]:
    """Scored trajectories of uneven lengths (so the ranks' shards hold different token counts) and off-policy
    behaviour logprobs."""
    out = []
    for i in range(count):
        prompt, completion = rng.randint(3, 12), rng.randint(2, 20)
        n = prompt + completion
        ctx = TurnContext(
            token_ids=[rng.randrange(3, vocab) for _ in range(n)],
            logprobs=[0.0] * prompt + [-rng.uniform(2.0, 6.0) for _ in range(completion)],
            loss_mask=[0] * prompt + [1] * completion,
            turn_versions=[0],
            turn_spans=[(prompt, n)],
        )
        out.append(
            TrajectoryRecord(
                workflow_id=f"traj-{i}",
                request=TrajectoryRequest(group=f"g{i // 2}", sampling=SamplingParams(temperature=1.0)),
                status=TrajectoryStatus.COMPLETED,
                reward=rng.random(),
                first_observation="",
                turns=[],
                context=ctx,
                env_recoveries=0,
            )
        )
    return out


def single_process(tiny_model: Path, batches: list[list[TrajectoryRecord]], steps: list[TrainStepInput]):
    """What one process makes of the same steps: (the weights it would publish after the last step, the steps'
    metrics)."""
    from trajflow.rl import lora
    from trajflow.rl.samples import samples_from_records
    from trajflow.rl.trainer import PolicyTrainer

    config = steps[0].trainer
    trainer = PolicyTrainer(tiny_model, config, seed=0)
    metrics = []
    for recs, step in zip(batches, steps, strict=True):
        samples = samples_from_records(recs, normalize_std=config.normalize_adv_std, refs=step.refs)
        metrics.append(trainer.train_step(samples, config))
    model = trainer.unwrapped_model
    published = lora.merged_state_dict(model) if config.lora is not None else model.state_dict()
    weights = {k: v.detach().clone() for k, v in published.items()}
    return weights, metrics


async def run_steps(client, pool: str, steps: list[TrainStepInput], workflow_id: str) -> list[TrainStepResult]:
    queue = f"test-ranks-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[TrainSteps], workflow_runner=UnsandboxedWorkflowRunner()):
        return await client.execute_workflow(
            TrainSteps.run, StepsInput(pool=pool, steps=steps), id=workflow_id, task_queue=queue,
            result_type=list[TrainStepResult],
        )  # fmt: skip


async def launched_steps(
    temporal_env,
    tmp_path: Path,
    name: str,
    tiny_model: Path,
    steps: list[TrainStepInput],
) -> tuple[list[TrainStepResult], str]:
    """Launch the trainer on two ranks, run `steps` through it, stop it as an operator would; results and log."""
    pool = f"ranks{uuid.uuid4().hex[:8]}"
    launched = LaunchedTrainer(tmp_path / f"state-{name}", pool, tmp_path / f"{name}.log")
    client = temporal_env.client
    try:
        address, store_url = client.service_client.config.target_host, (tmp_path / "store").as_uri()
        launched.start(address, store_url, tiny_model.parent, config=float32_config(tmp_path))
        launched.wait_polling()
        results = await run_steps(client, pool, steps, f"{steps[0].run_id}-{name}")
    finally:
        code = launched.stop()
    log = launched.text()
    assert code == 0, f"the launched trainer exited {code}:\n{log[-4000:]}"
    assert "rank 1: stop" in log, "rank 0 did not release rank 1 on shutdown"
    assert "launch attempt 1" not in log  # no restart
    for step in steps:
        assert f"rank 1: step v{step.version} of run {step.run_id} received" in log
    return results, log


LORA_CONFIG = CONFIG.model_copy(update={"lora": LoraConfig(rank=4, alpha=8)})


@pytest.mark.parametrize("config", [CONFIG, LORA_CONFIG], ids=["full", "lora"])
async def test_two_ranks_publish_what_one_process_trains(
    temporal_env, tiny_model: Path, tmp_path: Path, config: TrainerConfig
) -> None:
    """Steps v0 and v1 on one launch, stopped; v2 on a second launch, which resumes both ranks from the store. With
    LoRA, the ranks train adapters (DDP over the adapters only), checkpoint the adapter and publish merged weights."""
    from transformers import AutoConfig

    store = LocalStore(tmp_path / "store")
    run_id = f"ranks-{uuid.uuid4().hex[:8]}"
    vocab = AutoConfig.from_pretrained(tiny_model).vocab_size
    rng = random.Random(7)
    batches = [records(rng, 7, vocab), records(rng, 6, vocab), records(rng, 5, vocab)]  # odd: uneven shards
    steps = []
    for version, recs in enumerate(batches):
        refs = []
        for r in recs:
            uri = store.put_json(f"test/{run_id}/v{version}/{r.workflow_id}.json", r)
            assert r.reward is not None
            ref = TrainRef(
                workflow_id=r.workflow_id, trajectory_uri=uri, group=r.request.group, reward=r.reward, policy_version=0
            )
            refs.append(ref)
        steps.append(TrainStepInput(run_id=run_id, version=version, refs=refs, trainer=config))

    first, _ = await launched_steps(temporal_env, tmp_path, "first", tiny_model, steps[:2])
    resumed, log = await launched_steps(temporal_env, tmp_path, "resumed", tiny_model, steps[2:])
    assert f"resuming run {run_id} at v2 from the store" in log

    expected, metrics = single_process(tiny_model, batches, steps)
    results = first + resumed
    assert [r.version for r in results] == [1, 2, 3]
    for result, reference in zip(results, metrics, strict=True):
        assert result.metrics["loss"] == pytest.approx(reference["loss"], rel=1e-5, abs=1e-7)
        assert result.metrics["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-5)
        assert result.metrics["tokens"] == reference["tokens"]
    published = get_dir(store, policy_version_prefix(run_id, 3), tmp_path / "published")
    weights = load_file(str(published / "model.safetensors"))
    assert weights.keys() <= expected.keys() and len(weights) > 0
    assert {v.dtype for v in weights.values()} == {torch.float32}, "published in float32 (float32_config)"
    assert_same_update(weights, expected)


def assert_same_update(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Equal within float32 tolerance (rtol 1e-5, atol 1e-6), except where AdamW amplifies summation order:
    an element whose gradient is near Adam's eps (1e-8) has a step of g / (|g| + eps) * lr that a 1e-10 change
    of g moves by a visible fraction of lr. So: at most 1 in 10,000 elements outside the tight tolerance, and none
    further than 1% of one step (lr) from the single process's weight."""
    outside, total = 0, 0
    for name, value in got.items():
        reference = expected[name].to(value.dtype)
        diff = (value - reference).abs()
        outside += int((diff > 1e-6 + 1e-5 * reference.abs()).sum())
        total += value.numel()
        assert float(diff.max()) <= 1e-2 * CONFIG.lr, f"{name}: off by {float(diff.max()):.3g}, over 1% of lr"
    assert outside <= total // 10_000, f"{outside} of {total} weights outside rtol 1e-5 / atol 1e-6"


async def train_step_attempts(client, run_id: str) -> dict[int, int]:
    """Step version -> the attempt that completed it, from the training workflow's history."""
    scheduled: dict[int, int] = {}
    attempts: dict[int, int] = {}
    async for event in client.get_workflow_handle(run_id).fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == names.TRAIN_STEP:
                scheduled[event.event_id] = TrainStepInput.model_validate_json(attrs.input.payloads[0].data).version
        if event.HasField("activity_task_started_event_attributes"):
            attrs = event.activity_task_started_event_attributes
            if attrs.scheduled_event_id in scheduled:
                attempts[scheduled[attrs.scheduled_event_id]] = attrs.attempt
    return attempts


async def test_a_rank_killed_mid_step_is_restarted_and_the_run_finishes(
    temporal_env, reward_service, store, sandbox_manager, tiny_model: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    from tests.conftest import running_stack
    from trajflow.client import start_training
    from trajflow.contracts.tasks import TaskConfig
    from trajflow.contracts.training import TrainingRunConfig
    from trajflow.contracts.trajectory import StagePools
    from trajflow.infra.policies import PolicyStore
    from trajflow.rl.engines.scripted import ScriptedEngine

    policies = PolicyStore(store, tmp_path / "policies", pointer_ttl_s=0.0)
    engine = ScriptedEngine(AutoTokenizer.from_pretrained(tiny_model), "\\boxed{5}", weights=policies)
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, external_trainer=True) as st:
        launched = LaunchedTrainer(tmp_path / "state", st.pools, tmp_path / "trainer.log")
        try:
            launched.start(
                st.client.service_client.config.target_host, (tmp_path / "store").as_uri(), tiny_model.parent
            )
            first = launched.wait_polling()
            task = TaskConfig(
                max_turns=1,
                sampling=SamplingParams(temperature=1.0, max_new_tokens=16),
                pools=StagePools(decode=st.pools, env=st.pools, reward=st.pools),
            )
            cfg = TrainingRunConfig(
                tasks=[task], trainer_pool=st.pools, steps=3, batch_size=4, group_size=2, alpha=1, trainer=CONFIG
            )
            run_id = f"run-{uuid.uuid4().hex[:8]}"
            handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)
            # The first step builds the trainer on every rank before it trains: seconds, a wide window to land in.
            received = f"rank 1: step v0 of run {run_id} received"
            # (in a thread: the stack's workers run on this event loop)
            try:
                await asyncio.to_thread(
                    wait_for, lambda: received in launched.text(), 240, 0.02, "rank 1 to get step v0"
                )
            except TimeoutError as e:
                raise AssertionError(f"{e}\n{await pending_work(st.client, run_id)}") from None
            os.kill(first[1], signal.SIGKILL)
            assert f"rank 1: step v0 of run {run_id} done" not in launched.text(), "the kill landed after the step"
            restarted = await asyncio.to_thread(launched.wait_polling, 1)
            result = await asyncio.wait_for(handle.result(), timeout=300)
            attempts = await train_step_attempts(st.client, run_id)
        finally:
            code = launched.stop()
    log = launched.text()
    assert code == 0, f"the launched trainer exited {code}:\n{log[-4000:]}"
    assert restarted[1] != first[1] and restarted[0] != first[0]  # both ranks restarted
    assert result.version == 3 and len(result.history) == 3
    assert attempts[0] >= 2, f"step v0 was not retried: {attempts}"
    assert sorted(attempts) == [0, 1, 2]
    assert policies.latest_version(run_id, fresh=True) == 3
    assert log.count(f"rank 1: step v0 of run {run_id} done") == 1  # only the restarted rank 1 finished it
    assert all(log.count(f"rank 1: step v{v} of run {run_id} done") == 1 for v in (1, 2))
