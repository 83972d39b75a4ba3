"""The trainer worker under `accelerate launch` with two CPU processes (gloo), against the real Temporal dev server:

- two steps trained by two ranks publish the same weights (and the same loss) as one process training on the
  same batches: the gradients are all-reduced and the loss is normalised over the whole batch, not per rank;
- a rank SIGKILLed in the middle of a training run (`TrainingWorkflow`, real trajectories in Docker sandboxes)
  breaks the group; the launcher restarts both ranks, the step is retried, resumes from the store's checkpoint
  and the run finishes with every step published once.
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest
import torch
from pydantic import BaseModel
from safetensors.torch import load_file
from temporalio import workflow
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from contracts.records import TrajectoryRecord, TurnContext
from contracts.training import LossConfig, TrainerConfig, TrainRef, TrainStepInput, TrainStepResult
from contracts.trajectory import SamplingParams, TrajectoryRequest, TrajectoryStatus
from infra.layout import policy_version_prefix
from infra.policies import get_dir
from infra.store import LocalStore
from tests.integration.launched_trainer import LaunchedTrainer

pytestmark = pytest.mark.integration

CONFIG = TrainerConfig(lr=1e-3, micro_batch=2, autocast="off", loss=LossConfig(kind="ppo_clip", aggregation="token_mean"))
"""float32 everywhere (no bf16 autocast, whatever the CPU), so the two runs may differ only by summation order."""


class StepsInput(BaseModel):
    pool: str
    steps: list[TrainStepInput]


@workflow.defn(sandboxed=False)
class TrainSteps:
    """The optimizer steps of a run, one after another, as the TrainingWorkflow issues them."""

    @workflow.run
    async def run(self, inp: StepsInput) -> list[TrainStepResult]:
        from workflows import stubs

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


def single_process(tiny_model: Path, batches: list[list[TrajectoryRecord]], steps: list[TrainStepInput]):  # type: ignore[no-untyped-def]
    """What one process makes of the same steps: (weights after the last step, the steps' metrics)."""
    from rl.samples import samples_from_records
    from rl.trainer import PolicyTrainer

    trainer = PolicyTrainer(tiny_model, CONFIG, seed=0)
    metrics = []
    for recs, step in zip(batches, steps, strict=True):
        samples = samples_from_records(recs, normalize_std=CONFIG.normalize_adv_std, refs=step.refs)
        metrics.append(trainer.train_step(samples, CONFIG))
    weights = {k: v.detach().clone() for k, v in trainer.unwrapped_model.state_dict().items()}
    return weights, metrics


async def test_two_ranks_publish_what_one_process_trains(temporal_env, tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoConfig

    store = LocalStore(tmp_path / "store")
    run_id, pool = f"ranks-{uuid.uuid4().hex[:8]}", f"ranks{uuid.uuid4().hex[:8]}"
    vocab = AutoConfig.from_pretrained(tiny_model).vocab_size
    rng = random.Random(7)
    batches = [records(rng, 7, vocab), records(rng, 6, vocab)]  # 7: one rank gets one sample more
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
        steps.append(TrainStepInput(run_id=run_id, version=version, refs=refs, trainer=CONFIG))

    launched = LaunchedTrainer(tmp_path / "state", pool, tmp_path / "trainer.log")
    client = temporal_env.client
    try:
        launched.start(client.service_client.config.target_host, (tmp_path / "store").as_uri(), tiny_model.parent)
        launched.wait_polling()
        queue = f"test-ranks-{uuid.uuid4().hex[:8]}"
        async with Worker(client, task_queue=queue, workflows=[TrainSteps], workflow_runner=UnsandboxedWorkflowRunner()):
            results = await client.execute_workflow(
                TrainSteps.run, StepsInput(pool=pool, steps=steps), id=f"{run_id}-steps", task_queue=queue,
                result_type=list[TrainStepResult],
            )  # fmt: skip
    finally:
        code = launched.stop()
    assert code == 0, f"the launched trainer exited {code}:\n{launched.text()[-4000:]}"
    log = launched.text()
    assert "rank 1: stop" in log, "rank 0 did not release rank 1 on shutdown"
    assert all(f"rank 1: step v{v} of run {run_id} received" in log for v in (0, 1))
    assert "launch attempt 1" not in log  # no restart

    expected, metrics = single_process(tiny_model, batches, steps)
    assert [r.version for r in results] == [1, 2]
    for result, reference in zip(results, metrics, strict=True):
        assert result.metrics["loss"] == pytest.approx(reference["loss"], rel=1e-5, abs=1e-7)
        assert result.metrics["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-5)
        assert result.metrics["tokens"] == reference["tokens"]
    published = get_dir(store, policy_version_prefix(run_id, 2), tmp_path / "published")
    weights = load_file(str(published / "model.safetensors"))
    assert weights.keys() <= expected.keys() and len(weights) > 0
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
