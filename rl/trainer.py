"""The policy trainer: one optimizer step on a batch of training samples (`rl.samples`).

`PolicyTrainer.train_step` takes exactly one optimizer step on `TrainSample`s:

- samples are sharded over processes (`samples[process_index::num_processes]`) and split into right-padded
  micro-batches of `micro_batch` sequences;
- a teacher-forced forward pass gives the logprob of token t from the logits at t - 1, divided by the
  sample's sampling temperature and normalised in float32 (the first token has no logprob and must have loss
  mask 0);
- each micro-batch's loss is divided by the whole batch's token (token_mean) or non-empty sequence (seq_mean)
  count, times the process count that data-parallel gradient averaging divides by again, so the accumulated
  gradient is exactly the gradient of the full batch's aggregated loss, whatever `micro_batch` is;
- `prox_logprobs` (decoupled_ppo) are the same forward pass, detached: with one optimizer step per batch the
  proximal policy is the current one, so r' = 1 and decoupled_ppo's gradient equals a capped-IS REINFORCE;
- the gradient norm is clipped, AdamW steps, `version` (completed optimizer steps) increments.

With `config.lora` the model is wrapped with `peft` adapters (`rl.lora`): AdamW steps the adapters only, and
`unwrapped_model` is the `peft.PeftModel`.

Checkpoints and weight export (`save_checkpoint`, `load_checkpoint`, `export_weights`) are `rl.checkpoint`'s;
the methods here delegate to it.

Limits: one optimizer step per batch (no PPO epochs or mini-batches); constant learning rate; pure bf16 when
`dtype` is bfloat16 (no fp32 master weights); no sequence packing, so padding costs compute. Multi-GPU is
plain data parallelism through `accelerate launch` of code that uses PolicyTrainer (DDP-style replicated
weights; FSDP/DeepSpeed state dicts are not handled); `rl.distributed` runs it for the trainer worker, tested
with two CPU processes (gloo), not on GPUs. On a GPU, batches are built on the CPU and moved to the device;
metrics come back as floats, and checkpoints and exported weights are written from CPU copies. The
float32 logits of a whole micro-batch are kept for backward: `micro_batch` x length x vocabulary floats.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from contracts.training import TrainerConfig
from rl import checkpoint, lora
from rl.devices import resolve_device, use_device
from rl.losses import merge_metrics, policy_loss
from rl.precision import CpuInfo, Precision, autocast_precision
from rl.samples import TrainSample

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def _trainable_parameters(model: torch.nn.Module, config: TrainerConfig) -> tuple[torch.nn.Module, list[torch.nn.Parameter]]:
    """The model to train and the parameters AdamW steps:

    - `config.lora` set: the model wrapped with adapters (`rl.lora.wrap`), and the adapters' parameters;
    - `train_last_layers` = k > 0: only the last k decoder blocks and the final norm, the rest frozen
      (requires_grad False, so autograd never goes below the lowest trainable block);
    - otherwise every parameter."""
    if config.lora is not None:
        wrapped = lora.wrap(model, config.lora)
        return wrapped, lora.adapter_parameters(wrapped)
    last_layers = config.train_last_layers
    if last_layers == 0:
        return model, list(model.parameters())
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if base is None or layers is None or not hasattr(base, "norm"):
        raise ValueError(f"train_last_layers needs a decoder with .model.layers and .model.norm; {type(model).__name__} has none")
    if last_layers > len(layers):
        raise ValueError(f"train_last_layers = {last_layers} but the model has {len(layers)} blocks")
    model.requires_grad_(False)
    trainable = [*layers[-last_layers:], base.norm]
    for module in trainable:
        module.requires_grad_(True)
    return model, [p for m in trainable for p in m.parameters()]


def _micro_batches(samples: Sequence[TrainSample], size: int) -> list[list[TrainSample]]:
    return [list(samples[i : i + size]) for i in range(0, len(samples), size)]


@dataclass
class _Collated:
    """A right-padded micro-batch, on the training device."""

    ids: torch.Tensor
    attention: torch.Tensor
    behaviour: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    temperatures: torch.Tensor


class PolicyTrainer:
    """A causal LM, its AdamW optimizer and its policy version; see the module docstring."""

    def __init__(
        self,
        model_path: Path,
        config: TrainerConfig,
        *,
        seed: int = 0,
        accelerator: Any = None,
        cpu: CpuInfo | None = None,
        device: str = "auto",
    ) -> None:
        """Load `model_path` in `config.dtype`. `accelerator` None builds an `accelerate.Accelerator` on `device`
        (a setting: `auto` is a GPU when one is visible, else the CPU; `cpu`, `cuda`, `cuda:N`, see
        `rl.devices`); pass one to share it with the rest of a launched program (it then decides the device).
        `cpu` injects the CPU that `config.autocast = "auto"` decides for (None: this one)."""
        from accelerate import Accelerator
        from accelerate.utils import set_seed
        from transformers import AutoModelForCausalLM, AutoTokenizer

        set_seed(seed)
        self.model_path = Path(model_path)
        self.config = config
        self.version = 0
        """Completed optimizer steps (the policy version of the current weights)."""
        if accelerator is None:
            resolved = resolve_device(device)
            if resolved != "cpu":
                use_device(resolved)  # cuda:N becomes the current GPU, which accelerate's "cuda" means
            accelerator = Accelerator(cpu=resolved == "cpu")
        self.accelerator = accelerator
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=_as_dtype(config.dtype))
        # Eval mode: no dropout, so the policy being trained is the policy that was sampled. Gradients still flow.
        model.eval()
        model, trainable = _trainable_parameters(model, config)
        optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self._cpu = cpu
        self.autocast: Precision = autocast_precision(config.autocast, self.accelerator.device.type, cpu=cpu)
        """bfloat16: forward and backward under bf16 autocast; float32: autocast off. With the reason."""
        pad = self.tokenizer.pad_token_id
        self._pad_id = int(pad) if pad is not None else 0

    @property
    def unwrapped_model(self) -> Any:
        """The model without accelerate's wrapper (DDP): the Hugging Face model, or with LoRA its `peft.PeftModel`."""
        return self.accelerator.unwrap_model(self.model)

    def _collate(self, batch: Sequence[TrainSample]) -> _Collated:
        width = max(len(s.token_ids) for s in batch)
        ids = torch.full((len(batch), width), self._pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        behaviour = torch.zeros((len(batch), width), dtype=torch.float32)
        mask = torch.zeros((len(batch), width), dtype=torch.float32)
        for row, s in enumerate(batch):
            n = len(s.token_ids)
            ids[row, :n] = torch.tensor(s.token_ids, dtype=torch.long)
            attention[row, :n] = 1
            behaviour[row, :n] = torch.tensor(s.behaviour_logprobs, dtype=torch.float32)
            mask[row, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        advantages = torch.tensor([s.advantage for s in batch], dtype=torch.float32)
        temperatures = torch.tensor([s.temperature for s in batch], dtype=torch.float32)
        device = self.accelerator.device
        return _Collated(*(t.to(device) for t in (ids, attention, behaviour, mask, advantages, temperatures)))

    def _token_logprobs(self, batch: _Collated) -> torch.Tensor:
        """[B, L - 1]: column t - 1 is the logprob of token t given tokens < t (float32, at each row's temperature)."""
        device_type = self.accelerator.device.type
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=self.autocast.bf16):
            logits = self.model(input_ids=batch.ids, attention_mask=batch.attention, use_cache=False).logits
        logits = logits[:, :-1].float() / batch.temperatures[:, None, None]
        chosen = logits.gather(-1, batch.ids[:, 1:, None]).squeeze(-1)
        return chosen - torch.logsumexp(logits, dim=-1)

    def logprobs(self, samples: Sequence[TrainSample], micro_batch: int | None = None) -> list[list[float]]:
        """The current policy's teacher-forced logprob of every token (0.0 for the first), aligned with token_ids."""
        out: list[list[float]] = []
        with torch.no_grad():
            for batch in _micro_batches(samples, micro_batch or self.config.micro_batch):
                values = self._token_logprobs(self._collate(batch)).cpu()
                out += [[0.0, *values[row, : len(s.token_ids) - 1].tolist()] for row, s in enumerate(batch)]
        return out

    def _apply_hyperparameters(self, cfg: TrainerConfig) -> None:
        if cfg.dtype != self.config.dtype:
            raise ValueError(f"the trainer holds {self.config.dtype} weights; a step cannot switch to {cfg.dtype}")
        if cfg.train_last_layers != self.config.train_last_layers:
            raise ValueError("train_last_layers is fixed when the trainer is built; a step cannot change it")
        if cfg.lora != self.config.lora:
            raise ValueError("lora is fixed when the trainer is built; a step cannot change it")
        if cfg.autocast != self.config.autocast:
            self.autocast = autocast_precision(cfg.autocast, self.accelerator.device.type, cpu=self._cpu)
        self.config = cfg
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr
            group["weight_decay"] = cfg.weight_decay

    def _micro_step(
        self, batch: Sequence[TrainSample], cfg: TrainerConfig, denominator: float
    ) -> tuple[float, float, dict[str, float]]:
        """Forward and backward of one micro-batch; returns (its loss share, its masked tokens, its metrics)."""
        data = self._collate(batch)
        logp = self._token_logprobs(data)
        mask = data.mask[:, 1:]
        loss, metrics = policy_loss(
            cfg.loss, logp, data.behaviour[:, 1:], data.advantages, mask, logp.detach(), denominator=denominator
        )
        self.accelerator.backward(loss)
        return float(loss.detach().item()), float(mask.sum().item()), metrics

    def _global_metrics(self, loss: float, parts: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
        """This process's loss share and metrics combined with every other process's."""
        local = merge_metrics(parts)
        names = sorted(local)
        tokens = sum(t for t, _ in parts)
        row = torch.tensor(
            [loss, tokens, *(local[n] for n in names)], dtype=torch.float64, device=self.accelerator.device
        )
        gathered = self.accelerator.gather(row[None])
        assert isinstance(gathered, torch.Tensor)  # gather returns the type it was given; its stubs say any nesting
        rows = gathered.reshape(-1, len(row)).cpu().tolist()
        merged = merge_metrics([(r[1], dict(zip(names, r[2:], strict=True))) for r in rows])
        return {"loss": sum(r[0] for r in rows) / len(rows), **merged}

    def train_step(self, samples: Sequence[TrainSample], config: TrainerConfig | None = None) -> dict[str, float]:
        """One optimizer step on `samples` (the whole batch, every process passes the same list); see the module
        docstring. Returns loss, grad_norm, the loss metrics, tokens, sequences, autocast_bf16 (1.0 when the step
        ran under bf16 autocast), seconds."""
        if not samples:
            raise ValueError("train_step needs at least one sample")
        cfg = config or self.config
        self._apply_hyperparameters(cfg)
        started = time.perf_counter()
        acc = self.accelerator
        masks = [s.loss_mask for s in samples]
        full = sum(map(sum, masks)) if cfg.loss.aggregation == "token_mean" else sum(1 for m in masks if any(m))
        # Data-parallel backward averages gradients over processes; multiplying back by their count keeps the
        # sum of every process's micro-batch losses equal to the full batch's loss.
        denominator = full / acc.num_processes
        local = list(samples[acc.process_index :: acc.num_processes])
        # A process without samples still joins the gradient all-reduce, with a zero loss.
        local = local or [TrainSample([self._pad_id], [0.0], [0], 0.0)]
        micro = _micro_batches(local, cfg.micro_batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss_share = 0.0
        parts: list[tuple[float, dict[str, float]]] = []
        for index, batch in enumerate(micro):
            last = index == len(micro) - 1
            with contextlib.nullcontext() if last else acc.no_sync(self.model):
                share, tokens, metrics = self._micro_step(batch, cfg, denominator)
            loss_share += share
            parts.append((tokens, metrics))
        grad_norm = acc.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        assert grad_norm is not None  # accelerate gives None only under DeepSpeed, which this trainer does not support
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        result = self._global_metrics(loss_share, parts)
        return {
            **result,
            "grad_norm": float(grad_norm),
            "tokens": float(sum(map(sum, masks))),
            "sequences": float(len(samples)),
            "autocast_bf16": 1.0 if self.autocast.bf16 else 0.0,
            "seconds": time.perf_counter() - started,
        }

    def save_checkpoint(self, directory: Path) -> None:
        """Weights, AdamW state, version and RNG state into `directory` (replaced whole, via a temp dir)."""
        checkpoint.save_checkpoint(self, directory)

    def load_checkpoint(self, directory: Path) -> None:
        """Resume from `save_checkpoint`'s directory: weights, AdamW state, version and (this rank's) RNG."""
        checkpoint.load_checkpoint(self, directory)

    def export_weights(self, directory: Path, dtype: str | torch.dtype) -> None:
        """A Hugging Face checkpoint of the current weights in `dtype`, with the tokenizer, for decode workers
        (`from_pretrained(directory)` or `apply_weights`). Replaces `directory` whole, via a temp dir."""
        checkpoint.export_weights(self, directory, _as_dtype(dtype))
