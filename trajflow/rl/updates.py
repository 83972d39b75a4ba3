"""One train step's update loop: epochs, a seeded shuffle, mini-batches, each process's shard and micro-batches,
the fixed proximal/reference logprobs, the forward/backward passes and the optimizer updates.

`PolicyTrainer.train_step` (`trajflow.rl.trainer`) checks the step's config and delegates here (`run_step`), then
increments the version once. A step makes `ppo_epochs` passes over its batch; each pass shuffles the batch (a
`random.Random` seeded by the trainer config's `seed` and the step's policy version, so every step shuffles
differently and a rerun of the step the same way, without touching the global RNGs that checkpoints save) and
splits it into `mini_batches` mini-batches of near-equal size (the first `len % mini_batches` one longer), one
optimizer update each. With one mini-batch nothing is shuffled: the batch keeps its order, so a step with the
defaults is exactly the one-update step of before. Each mini-batch is sharded over data-parallel processes
(`mini[rank::world]`) and a shard is cut into micro-batches for gradient accumulation; `trajflow.rl.trainer`'s docstring
says how losses are divided so that each update's gradient is exactly its mini-batch's.

Before the first update, one no-grad pass computes what stays fixed through the step: the proximal logprobs
(decoupled_ppo with more than one update: the policy at the start of the step, AReaL's proximal policy) and the
frozen reference's logprobs (kl_coef > 0). They are kept on the CPU, one float per token each.

Limits: mini-batches are split by sequence count, not token count, and each update's loss is its own
mini-batch's aggregate; metrics are merged over all updates (a later update's clipping and the first update's
engine/trainer mismatch are mixed, token-weighted).
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import torch

from trajflow.contracts.training import TrainerConfig
from trajflow.rl.losses import batch_denominator, merge_metrics, policy_loss
from trajflow.rl.samples import TrainSample

if TYPE_CHECKING:
    from trajflow.rl.reference import FrozenReference
    from trajflow.rl.trainer import Collated, PolicyTrainer

T = TypeVar("T")

_ENTROPY_CHUNK = 512
"""Generated tokens whose softmax is materialised at once by `token_entropy` (x vocabulary floats)."""


def update_plan(size: int, *, epochs: int, mini_batches: int, seed: int, version: int) -> list[list[int]]:
    """The sample indices of every optimizer update of a step, in order: `epochs` x `mini_batches` lists."""
    if size < 1 or epochs < 1 or mini_batches < 1:
        raise ValueError(f"a step needs samples, epochs and mini-batches; got {size}, {epochs}, {mini_batches}")
    if mini_batches > size:
        raise ValueError(f"mini_batches = {mini_batches} but the step's batch has only {size} samples")
    rng = random.Random(f"trajflow-step-shuffle:{seed}:{version}")
    plan: list[list[int]] = []
    for _ in range(epochs):
        order = list(range(size))
        if mini_batches > 1:
            rng.shuffle(order)
        base, longer = divmod(size, mini_batches)
        start = 0
        for k in range(mini_batches):
            end = start + base + (1 if k < longer else 0)
            plan.append(order[start:end])
            start = end
    return plan


def shard(items: Sequence[T], rank: int, world: int) -> list[T]:
    """This process's share of a mini-batch."""
    return list(items[rank::world])


def micro_batches(items: Sequence[T], size: int) -> list[list[T]]:
    """Consecutive chunks of at most `size`."""
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def next_token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, L - 1] logprob of each next token under `logits` [B, L - 1, V] (column t - 1 is token t's), and each
    position's log-normaliser (logsumexp of its logits)."""
    logz = torch.logsumexp(logits, dim=-1)
    return logits.gather(-1, ids[:, 1:, None]).squeeze(-1) - logz, logz


def first_loss_column(mask: torch.Tensor) -> int:
    """The first column of a micro-batch's token logprobs ([B, L - 1], `mask[:, 1:]`) where any row has a loss
    token, 0 when none has. The columns before it need no logits: the loss and its metrics read masked tokens
    only, so the LM head (a vocabulary-sized matmul per position) skips the shared prompt."""
    columns = (mask[:, 1:] > 0).any(dim=0).nonzero()
    return int(columns[0]) if len(columns) else 0


def loss_logprobs(
    trainer: PolicyTrainer, data: Collated, reference: FrozenReference | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """[B, L - 1] token logprobs of `data` (the trainer's policy, or `reference`'s), computed from
    `first_loss_column` on and 0.0 before it; with the logits [B, L - 1 - start, V] and their log-normalisers
    those columns came from, and `start`."""
    start = first_loss_column(data.mask)
    logits = trainer.logits(data, reference, start=start)
    logp, logz = next_token_logprobs(logits, data.ids[:, start:])
    return torch.nn.functional.pad(logp, (start, 0)), logz, logits, start


def token_entropy(logits: torch.Tensor, logz: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[B, L] entropy of softmax(logits) at the `valid` positions (0 elsewhere), H = logz - sum p * logits,
    computed a chunk of positions at a time so that no second [B, L, V] tensor is built."""
    rows, cols = valid.nonzero(as_tuple=True)
    values = []
    for start in range(0, len(rows), _ENTROPY_CHUNK):
        r, c = rows[start : start + _ENTROPY_CHUNK], cols[start : start + _ENTROPY_CHUNK]
        chunk, z = logits[r, c], logz[r, c]
        values.append(z - (torch.exp(chunk - z[:, None]) * chunk).sum(-1))
    entropy = torch.zeros(valid.shape, dtype=logits.dtype, device=logits.device)
    return entropy.index_put((rows, cols), torch.cat(values)) if values else entropy


@dataclass
class _Fixed:
    """Per-sample logprobs that stay fixed through a step's updates (1-D, aligned with token_ids[1:]), by index."""

    prox: dict[int, torch.Tensor]
    ref: dict[int, torch.Tensor]


@dataclass
class _Update:
    """What one optimizer update reports: this process's loss share, the gradient norm, (tokens, metrics) parts."""

    loss: float
    grad_norm: float
    parts: list[tuple[float, dict[str, float]]]


def _fixed_logprobs(
    trainer: PolicyTrainer, samples: Sequence[TrainSample], indices: list[int], cfg: TrainerConfig, updates: int
) -> _Fixed:
    """The proximal (decoupled_ppo with more than one update) and reference (kl_coef > 0) logprobs of the
    samples at `indices`, from one no-grad pass before the step's first update; kept on the CPU."""
    fixed = _Fixed({}, {})
    want_prox = cfg.loss.kind == "decoupled_ppo" and updates > 1
    reference = trainer.reference if cfg.loss.kl_coef > 0 else None
    if not want_prox and reference is None:
        return fixed
    with torch.no_grad():
        for chunk in micro_batches(indices, cfg.micro_batch):
            data = trainer.collate([samples[i] for i in chunk])
            prox = loss_logprobs(trainer, data)[0].cpu() if want_prox else None
            ref = loss_logprobs(trainer, data, reference)[0].cpu() if reference is not None else None
            for row, i in enumerate(chunk):
                n = len(samples[i].token_ids) - 1
                if prox is not None:
                    fixed.prox[i] = prox[row, :n].clone()
                if ref is not None:
                    fixed.ref[i] = ref[row, :n].clone()
    return fixed


def _micro_step(
    trainer: PolicyTrainer, batch: list[tuple[int, TrainSample]], cfg: TrainerConfig, fixed: _Fixed, denominator: float
) -> tuple[float, float, dict[str, float]]:
    """Forward and backward of one micro-batch of (index, sample); returns (its loss share, its masked tokens,
    its metrics). Index -1 is a placeholder sample, without fixed logprobs."""
    empty = torch.zeros(0)
    prox = [fixed.prox.get(i, empty) for i, _ in batch] if fixed.prox else None
    ref = [fixed.ref.get(i, empty) for i, _ in batch] if fixed.ref else None
    data = trainer.collate([s for _, s in batch], prox, ref)
    logp, logz, logits, start = loss_logprobs(trainer, data)
    mask = data.mask[:, 1:]
    valid = mask[:, start:] > 0
    if cfg.loss.entropy_coef > 0:
        entropy = token_entropy(logits, logz, valid)
    else:
        with torch.no_grad():
            entropy = token_entropy(logits.detach(), logz.detach(), valid)
    entropy = torch.nn.functional.pad(entropy, (start, 0))
    # per-token advantages are aligned with the ids; token t's logprob is column t - 1
    advantages = data.advantages if data.advantages.dim() == 1 else data.advantages[:, 1:]
    loss, metrics = policy_loss(
        cfg.loss,
        logp,
        data.behaviour[:, 1:],
        advantages,
        mask,
        data.prox if data.prox is not None else logp.detach(),  # one update: the step's start is this pass
        ref_logprobs=data.ref,
        entropy=entropy,
        denominator=denominator,
    )
    trainer.accelerator.backward(loss)
    return float(loss.detach().item()), float(mask.sum().item()), metrics


def _update(
    trainer: PolicyTrainer, samples: Sequence[TrainSample], indices: list[int], cfg: TrainerConfig, fixed: _Fixed
) -> _Update:
    """One optimizer update on the mini-batch `indices` (every process passes the same), on this process's shard."""
    acc = trainer.accelerator
    # Data-parallel backward averages gradients over processes; multiplying back by their count keeps the
    # sum of every process's micro-batch losses equal to the mini-batch's loss.
    denominator = batch_denominator([samples[i].loss_mask for i in indices], cfg.loss.aggregation) / acc.num_processes
    local = [(i, samples[i]) for i in shard(indices, acc.process_index, acc.num_processes)]
    # A process without samples still joins the gradient all-reduce, with a zero loss.
    local = local or [(-1, TrainSample([trainer.pad_id], [0.0], [0], 0.0))]
    micro = micro_batches(local, cfg.micro_batch)
    trainer.optimizer.zero_grad(set_to_none=True)
    loss_share = 0.0
    parts: list[tuple[float, dict[str, float]]] = []
    for index, batch in enumerate(micro):
        last = index == len(micro) - 1
        with contextlib.nullcontext() if last else acc.no_sync(trainer.model):
            share, tokens, metrics = _micro_step(trainer, batch, cfg, fixed, denominator)
        loss_share += share
        parts.append((tokens, metrics))
    grad_norm = acc.clip_grad_norm_(trainer.model.parameters(), cfg.grad_clip)
    assert grad_norm is not None  # accelerate gives None only under DeepSpeed, which this trainer does not support
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    return _Update(loss_share, float(grad_norm), parts)


def _global_metrics(
    trainer: PolicyTrainer, loss: float, parts: list[tuple[float, dict[str, float]]]
) -> dict[str, float]:
    """This process's loss share and metrics combined with every other process's."""
    local = merge_metrics(parts)
    names = sorted(local)
    tokens = sum(t for t, _ in parts)
    device = trainer.accelerator.device
    row = torch.tensor([loss, tokens, *(local[n] for n in names)], dtype=torch.float64, device=device)
    gathered = trainer.accelerator.gather(row[None])
    assert isinstance(gathered, torch.Tensor)  # gather returns the type it was given; its stubs say any nesting
    rows = gathered.reshape(-1, len(row)).cpu().tolist()
    merged = merge_metrics([(r[1], dict(zip(names, r[2:], strict=True))) for r in rows])
    return {"loss": sum(r[0] for r in rows) / len(rows), **merged}


def run_step(trainer: PolicyTrainer, samples: Sequence[TrainSample], cfg: TrainerConfig) -> dict[str, float]:
    """Every optimizer update of one step on `samples` (see the module docstring), and the step's metrics; the
    caller increments the version."""
    started = time.perf_counter()
    plan = update_plan(
        len(samples), epochs=cfg.ppo_epochs, mini_batches=cfg.mini_batches, seed=cfg.seed, version=trainer.version
    )
    acc = trainer.accelerator
    mine = sorted({i for indices in plan for i in shard(indices, acc.process_index, acc.num_processes)})
    fixed = _fixed_logprobs(trainer, samples, mine, cfg, len(plan))
    updates = [_update(trainer, samples, indices, cfg, fixed) for indices in plan]
    loss_share = sum(u.loss for u in updates) / len(updates)
    result = _global_metrics(trainer, loss_share, [part for u in updates for part in u.parts])
    return {
        **result,
        "grad_norm": sum(u.grad_norm for u in updates) / len(updates),
        "updates": float(len(updates)),
        "tokens": float(sum(sum(s.loss_mask) for s in samples)),
        "sequences": float(len(samples)),
        "autocast_bf16": 1.0 if trainer.autocast.bf16 else 0.0,
        "seconds": time.perf_counter() - started,
    }
