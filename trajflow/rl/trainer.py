"""The policy trainer: one train step on a batch of training samples (`trajflow.rl.samples`), publishing one version.

`PolicyTrainer.train_step` takes `ppo_epochs` x `mini_batches` optimizer updates on `TrainSample`s and
increments `version` (the policy version) by one, whatever the number of updates:

- the batch is shuffled and split into mini-batches (`trajflow.rl.updates`: seeded by the config's `seed` and the
  version); every mini-batch is sharded over processes and split into right-padded micro-batches of
  `micro_batch` sequences;
- a teacher-forced forward pass gives the logprob of token t from the logits at t - 1, divided by the
  sample's sampling temperature and normalised in float32 (the first token has no logprob and must have loss
  mask 0), and the entropy of that distribution at every generated token (from the same logits). The LM head
  runs only from the micro-batch's first loss token on (`trajflow.rl.updates.first_loss_column`, through the model's
  `logits_to_keep`): a shared prompt before it reaches the loss through no logprob, so its logits are not made;
- each micro-batch's loss is divided by its mini-batch's token (token_mean) or non-empty sequence (seq_mean,
  token_sum_norm) count, times the process count that data-parallel gradient averaging divides by again, so
  the accumulated gradient of an update is exactly the gradient of its mini-batch's aggregated loss, whatever
  `micro_batch` is;
- `prox_logprobs` (decoupled_ppo) are the policy at the start of the step: with more than one update they are
  computed once, by a no-grad forward pass over the batch before the first update, and every update of the
  step uses them (AReaL's proximal policy); with one update that pass is skipped, because the update's own
  forward pass, detached, is the same policy (r' = 1);
- with `kl_coef > 0` the frozen reference's logprobs (`trajflow.rl.reference`, the initial model) are computed in that
  same no-grad pass, once per step, and the KL penalty joins the loss (`trajflow.rl.losses`);
- per update: the gradient norm is clipped and AdamW steps. Metrics are merged over every update (token-weighted;
  `loss` and `grad_norm` are means over updates), with `updates` the count.

With `config.lora` the model is wrapped with `peft` adapters (`trajflow.rl.lora`): AdamW steps the adapters only, and
`unwrapped_model` is the `peft.PeftModel`.

Checkpoints and weight export (`save_checkpoint`, `load_checkpoint`, `export_weights`) are `trajflow.rl.checkpoint`'s;
the methods here delegate to it.

Limits: constant learning rate; pure bf16 when `dtype` is bfloat16 (no fp32 master weights); no sequence
packing, so padding costs compute. Multi-GPU is plain data parallelism through `accelerate launch` of code that
uses PolicyTrainer (DDP-style replicated weights; FSDP/DeepSpeed state dicts are not handled); `trajflow.rl.distributed`
runs it for the trainer worker, tested with two CPU processes (gloo), not on GPUs. On a GPU, batches are built
on the CPU and moved to the device; metrics come back as floats, and checkpoints and exported weights are
written from CPU copies. The float32 logits of a micro-batch from its first loss token on are kept for
backward: `micro_batch` x (length - prompt) x vocabulary floats (twice that with an entropy bonus, whose softmax
is kept too). With kl_coef > 0 the trainer holds a copy of the initial trainable parameters (`trajflow.rl.reference`:
the top k blocks with train_last_layers = k).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trajflow.contracts.training import TrainerConfig
from trajflow.rl import checkpoint, lora, updates
from trajflow.rl.devices import resolve_device, use_device
from trajflow.rl.precision import CpuInfo, Precision, autocast_precision
from trajflow.rl.reference import FrozenReference
from trajflow.rl.samples import TrainSample

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def _trainable_parameters(
    model: torch.nn.Module, config: TrainerConfig
) -> tuple[torch.nn.Module, list[torch.nn.Parameter]]:
    """The model to train and the parameters AdamW steps:

    - `config.lora` set: the model wrapped with adapters (`trajflow.rl.lora.wrap`), and the adapters' parameters;
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
        raise ValueError(
            f"train_last_layers needs a decoder with .model.layers and .model.norm; {type(model).__name__} has none"
        )
    if last_layers > len(layers):
        raise ValueError(f"train_last_layers = {last_layers} but the model has {len(layers)} blocks")
    model.requires_grad_(False)
    trainable = [*layers[-last_layers:], base.norm]
    for module in trainable:
        module.requires_grad_(True)
    return model, [p for m in trainable for p in m.parameters()]


@dataclass
class Collated:
    """A right-padded micro-batch, on the training device. `advantages` is [B], or [B, L] (aligned with `ids`)
    when a sample carries per-token advantages. `prox` and `ref` ([B, L - 1], aligned with the token logprobs) are
    the step's fixed proximal and reference logprobs, where the step computed them."""

    ids: torch.Tensor
    attention: torch.Tensor
    behaviour: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    temperatures: torch.Tensor
    prox: torch.Tensor | None = None
    ref: torch.Tensor | None = None


def _padded(rows: list[torch.Tensor], width: int, device: torch.device) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for row, values in enumerate(rows):
        out[row, : len(values)] = values.cpu()
    return out.to(device)


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
        `trajflow.rl.devices`); pass one to share it with the rest of a launched program (it then decides the device).
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
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        """Whether the model computes logits at the last N positions only (most causal LMs in transformers)."""
        model, trainable = _trainable_parameters(model, config)
        optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self._cpu = cpu
        self.autocast: Precision = autocast_precision(config.autocast, self.accelerator.device.type, cpu=cpu)
        """bfloat16: forward and backward under bf16 autocast; float32: autocast off. With the reason."""
        pad = self.tokenizer.pad_token_id
        self._pad_id = int(pad) if pad is not None else 0
        self.reference = FrozenReference(self.unwrapped_model) if config.loss.kl_coef > 0 else None
        """The initial policy for the KL penalty (`trajflow.rl.reference`), only when built with kl_coef > 0."""

    @property
    def unwrapped_model(self) -> Any:
        """The model without accelerate's wrapper (DDP): the Hugging Face model, or with LoRA its `peft.PeftModel`."""
        return self.accelerator.unwrap_model(self.model)

    @property
    def pad_id(self) -> int:
        """The token id that right-pads a batch."""
        return self._pad_id

    def collate(
        self,
        batch: Sequence[TrainSample],
        prox: list[torch.Tensor] | None = None,
        ref: list[torch.Tensor] | None = None,
    ) -> Collated:
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
        if any(s.token_advantages is not None for s in batch):  # per-turn credit: [B, L], a value a token
            per_token = torch.zeros((len(batch), width), dtype=torch.float32)
            for row, s in enumerate(batch):
                n = len(s.token_ids)
                per_token[row, :n] = torch.tensor(s.token_advantages or [s.advantage] * n, dtype=torch.float32)
            advantages = per_token
        temperatures = torch.tensor([s.temperature for s in batch], dtype=torch.float32)
        device = self.accelerator.device
        tensors = (t.to(device) for t in (ids, attention, behaviour, mask, advantages, temperatures))
        fixed = (_padded(rows, width - 1, device) if rows is not None else None for rows in (prox, ref))
        return Collated(*tensors, *fixed)

    def logits(self, batch: Collated, reference: FrozenReference | None = None, start: int = 0) -> torch.Tensor:
        """[B, L - 1 - start, V]: float32 logits predicting tokens start + 1.. (columns start.. of the token
        logprobs) at each row's temperature; with `reference`, of the frozen reference policy (no gradient).
        Positions before `start` skip the LM head where the model takes `logits_to_keep`."""
        if not 0 <= start < batch.ids.shape[1]:
            raise ValueError(f"start {start} is outside the batch's {batch.ids.shape[1]} positions")
        device_type = self.accelerator.device.type
        inputs: dict[str, Any] = {"input_ids": batch.ids, "attention_mask": batch.attention, "use_cache": False}
        keep = start > 0 and self._keeps_logits
        if keep:
            inputs["logits_to_keep"] = batch.ids.shape[1] - start  # the last L - start positions
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=self.autocast.bf16):
            out = self.model(**inputs) if reference is None else reference.forward(self.unwrapped_model, **inputs)
        logits = out.logits[:, :-1] if keep else out.logits[:, start:-1]
        return logits.float() / batch.temperatures[:, None, None]

    def logprobs(self, samples: Sequence[TrainSample], micro_batch: int | None = None) -> list[list[float]]:
        """The current policy's teacher-forced logprob of every token (0.0 for the first), aligned with token_ids."""
        out: list[list[float]] = []
        with torch.no_grad():
            for batch in updates.micro_batches(samples, micro_batch or self.config.micro_batch):
                data = self.collate(batch)
                values = updates.next_token_logprobs(self.logits(data), data.ids)[0].cpu()
                out += [[0.0, *values[row, : len(s.token_ids) - 1].tolist()] for row, s in enumerate(batch)]
        return out

    def _apply_hyperparameters(self, cfg: TrainerConfig) -> None:
        if cfg.dtype != self.config.dtype:
            raise ValueError(f"the trainer holds {self.config.dtype} weights; a step cannot switch to {cfg.dtype}")
        if cfg.train_last_layers != self.config.train_last_layers:
            raise ValueError("train_last_layers is fixed when the trainer is built; a step cannot change it")
        if cfg.loss.kl_coef > 0 and self.reference is None:
            raise ValueError(
                "kl_coef > 0 needs the frozen reference policy, which the trainer keeps only when it is built with "
                "kl_coef > 0 (its initial weights are gone afterwards); a step cannot switch the KL penalty on"
            )
        if cfg.lora != self.config.lora:
            raise ValueError("lora is fixed when the trainer is built; a step cannot change it")
        if cfg.autocast != self.config.autocast:
            self.autocast = autocast_precision(cfg.autocast, self.accelerator.device.type, cpu=self._cpu)
        self.config = cfg
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr
            group["weight_decay"] = cfg.weight_decay

    def train_step(self, samples: Sequence[TrainSample], config: TrainerConfig | None = None) -> dict[str, float]:
        """One train step on `samples` (the whole batch, every process passes the same list): ppo_epochs x
        mini_batches optimizer updates, one new version; see the module docstring and `trajflow.rl.updates`. Returns
        loss and grad_norm (means over updates), the loss metrics (merged over updates), updates, tokens, sequences,
        autocast_bf16 (1.0 when the step ran under bf16 autocast), seconds."""
        if not samples:
            raise ValueError("train_step needs at least one sample")
        cfg = config or self.config
        self._apply_hyperparameters(cfg)
        metrics = updates.run_step(self, samples, cfg)
        self.version += 1
        return metrics

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
