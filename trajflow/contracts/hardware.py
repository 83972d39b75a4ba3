"""The run config's hardware-affinity section: which host runs which pool's worker, with which CPUs, threads,
memory, device and GPUs.

```toml
[[hardware.hosts]]
name = "decode"
runs = ["decode"]            # every decode pool; "decode:fast" names one pool
cpus = "0-3"                 # a cpuset
threads = 4                  # torch / OpenMP threads of each torch worker on this host
device = "auto"              # auto | cpu | cuda | cuda:N (N counts the host's own GPUs from 0)
gpus = "0"                   # the machine's GPUs this host gets
memory = "16g"
```

One entry is one host: with `trajflow up --hosts` a container of the worker image, on a cluster a machine or a
pod; in the embedded stack (`trajflow up`) the section still sets each worker process's CPUs, threads, device and
GPUs. A worker kind or pool no host names runs with the defaults (`Placement`). A decode pool may run on several
hosts: each is a replica polling the pool's queue (the embedded stack's replicas are `[pools] decode_replicas`);
everything else runs on one host. What a host *is* (an address, a
container) is not here: that is deployment, and comes from settings.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from trajflow.contracts.base import Contract

__all__ = ["WORKER_KINDS", "POOL_KINDS", "TORCH_KINDS", "REPLICATED", "HostConfig", "HardwareConfig", "parse_cpuset"]

POOL_KINDS = ("decode", "env", "reward", "trainer")
"""Worker kinds that serve named pools (one task queue per pool)."""
WORKER_KINDS = ("orchestrator", "reward-service", *POOL_KINDS)
"""Everything a host can run: the workflow worker, the reward HTTP service and the pool workers."""
TORCH_KINDS = ("decode", "trainer")
"""Kinds whose processes run torch compute (their threads are what must not oversubscribe the cores)."""

REPLICATED = "decode"
"""The kind whose pools may run on several hosts at once (replicas polling one queue): every other pool, and the
orchestrator and reward service, runs on one host."""

WorkerKind = Literal["orchestrator", "reward-service", "decode", "env", "reward", "trainer"]

_RUN = re.compile(r"^(orchestrator|reward-service|(decode|env|reward|trainer)(:[A-Za-z0-9_.-]+)?)$")
_CPUSET = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
_GPU = re.compile(r"^[A-Za-z0-9][A-Za-z0-9/_-]*$")  # an index, or a GPU or MIG UUID


def parse_cpuset(cpus: str) -> list[int]:
    """`"0-2,5"` -> `[0, 1, 2, 5]` (the cpuset syntax of Docker's `--cpuset-cpus` and `taskset -c`)."""
    out: set[int] = set()
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if last < first:
            raise ValueError(f"cpuset range {part!r} runs backwards")
        out.update(range(first, last + 1))
    return sorted(out)


class HostConfig(Contract):
    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$")]
    """The host's name: the container's name (prefixed `trajflow-`) under `trajflow up --hosts`."""
    runs: Annotated[list[str], Field(min_length=1)]
    """What runs here: `orchestrator`, `reward-service`, a pool kind (`decode`, `env`, `reward`, `trainer`: every
    pool of that kind no other host names), or `kind:pool` for one pool. Only `decode` / `decode:pool` may appear on
    several hosts (replicas of those pools); anything else runs on one host."""
    cpus: str | None = None
    """A cpuset (`"0-3"`, `"0,2"`): the CPUs this host's workers may run on. None: every CPU."""
    threads: Annotated[int, Field(ge=1, le=1024)] | None = None
    """torch intra-op and OpenMP threads of each torch worker (decode, trainer) on this host. None: the host's
    CPUs divided among the torch workers that share them, at least 1, so two busy ones never oversubscribe."""
    memory: Annotated[str, Field(pattern=r"^\d+(\.\d+)?[kmg]?$")] | None = None
    """Memory limit (`"8g"`) of the host's container under `--hosts`; the embedded stack does not limit memory."""
    device: str = "auto"
    """Where the decode engine and the trainer compute: `auto` (a GPU when one is visible, else the CPU), `cpu`,
    `cuda`, `cuda:N`. With `gpus` set the workers see only those, renumbered from 0: `cuda:N` is the host's N-th
    GPU, and `auto` must find one (a worker that sees none fails at start, naming the host)."""
    gpus: str | None = None
    """The machine's GPUs this host gets, by index or UUID as `nvidia-smi` lists them (`"0"`, `"2,3"`; `""` for
    none). The embedded stack sets its workers' `CUDA_VISIBLE_DEVICES` to them; `trajflow up --hosts` gives them to
    the host's container (a device request), where they are renumbered from 0. None: inherit (whatever the
    process or container sees)."""

    @field_validator("runs")
    @classmethod
    def _runs_are_known(cls, runs: list[str]) -> list[str]:
        bad = [r for r in runs if not _RUN.match(r)]
        if bad:
            raise ValueError(f"unknown entries {bad}: use {', '.join(WORKER_KINDS)}, or kind:pool for a pool kind")
        if len(set(runs)) != len(runs):
            raise ValueError(f"an entry is listed twice in {runs}")
        return runs

    @field_validator("cpus")
    @classmethod
    def _cpuset(cls, cpus: str | None) -> str | None:
        if cpus is not None:
            if not _CPUSET.match(cpus):
                raise ValueError(f"cpus {cpus!r} is not a cpuset like '0-3' or '0,2'")
            parse_cpuset(cpus)
        return cpus

    @field_validator("device")
    @classmethod
    def _device(cls, device: str) -> str:
        if not _DEVICE.match(device):
            raise ValueError(f"device {device!r}: use auto, cpu, cuda or cuda:N")
        return device

    @field_validator("gpus")
    @classmethod
    def _gpu_list(cls, gpus: str | None) -> str | None:
        if gpus:
            ids = gpus.split(",")
            if not all(_GPU.match(i) for i in ids) or len(set(ids)) != len(ids):
                raise ValueError(f"gpus {gpus!r} is not a list of distinct GPU indexes or UUIDs like '0' or '2,3'")
        return gpus

    @model_validator(mode="after")
    def _device_is_among_the_gpus(self) -> HostConfig:
        ids = self.gpu_ids()
        if ids is None or not self.device.startswith("cuda"):
            return self
        index = int(self.device.partition(":")[2] or 0)
        if not ids:
            raise ValueError(f"host {self.name!r}: device {self.device!r}, but gpus '' gives it no GPU")
        if index >= len(ids):
            raise ValueError(
                f"host {self.name!r}: device {self.device!r} is not among its gpus {self.gpus!r}: its workers see "
                f"them renumbered from 0, as cuda:0..cuda:{len(ids) - 1}"
            )
        return self

    def gpu_ids(self) -> list[str] | None:
        """The GPUs of `gpus` (`[]` for `""`: none); None when `gpus` is unset."""
        if self.gpus is None:
            return None
        return self.gpus.split(",") if self.gpus else []

    def kinds(self) -> list[str]:
        """The worker kinds this host runs, in the order of `WORKER_KINDS`."""
        named = {r.partition(":")[0] for r in self.runs}
        return [k for k in WORKER_KINDS if k in named]

    def pools_of(self, kind: str, declared: list[str], elsewhere: set[str]) -> list[str]:
        """The pools of `kind` this host serves: those it names, or with a bare `kind`, every declared pool that
        no other host names (`elsewhere`)."""
        if kind in self.runs:
            return [p for p in declared if p not in elsewhere]
        return [r.partition(":")[2] for r in self.runs if r.partition(":")[0] == kind]


class HardwareConfig(Contract):
    hosts: list[HostConfig] = Field(default_factory=list)
    """The hosts and what each runs. Empty: one process per worker kind with the defaults (the embedded stack)."""

    @model_validator(mode="after")
    def _each_thing_runs_once(self) -> HardwareConfig:
        names = [h.name for h in self.hosts]
        if len(set(names)) != len(names):
            raise ValueError(f"host names must be unique, got {names}")
        seen: dict[str, str] = {}
        for host in self.hosts:
            for entry in host.runs:
                if entry in seen and not entry.startswith(REPLICATED):
                    raise ValueError(
                        f"{entry!r} runs on both host {seen[entry]!r} and host {host.name!r} (only decode pools run on "
                        "several hosts, as replicas)"
                    )
                seen[entry] = host.name
        return self

    def host_of(self, kind: str, pool: str | None = None) -> HostConfig | None:
        """The host that runs `kind` (and `pool`, for a pool kind): the one naming `kind:pool`, else the one naming
        the bare kind, else None (the defaults). A decode pool on several hosts: the first of them."""
        if pool is not None:
            for host in self.hosts:
                if f"{kind}:{pool}" in host.runs:
                    return host
        return next((h for h in self.hosts if kind in h.runs), None)

    def pools_on(self, host: HostConfig, kind: str, declared: list[str]) -> list[str]:
        """The declared pools of `kind` that `host` serves."""
        elsewhere = {
            r.partition(":")[2]
            for h in self.hosts
            if h.name != host.name
            for r in h.runs
            if r.partition(":")[0] == kind and ":" in r
        }
        return host.pools_of(kind, declared, elsewhere)

    def serving(self, kind: str, declared: list[str]) -> dict[str, int]:
        """How many hosts serve each declared pool of `kind` (more than one: replicas of a decode pool)."""
        served = [p for h in self.hosts if kind in h.kinds() for p in self.pools_on(h, kind, declared)]
        return {p: served.count(p) for p in declared}

    def unplaced(self, declared: dict[str, list[str]]) -> list[str]:
        """What no host runs: worker kinds, and `kind:pool` for pools of a kind placed only pool by pool."""
        missing = []
        for kind in WORKER_KINDS:
            if kind in POOL_KINDS:
                missing += [f"{kind}:{p}" for p in declared[kind] if self.host_of(kind, p) is None]
            elif self.host_of(kind) is None:
                missing.append(kind)
        return missing

    def threads_for(self, host: HostConfig | None, cpu_count: int, decode_replicas: int = 1) -> int:
        """torch threads of one torch worker on `host` (None: a kind no host names, which runs on every CPU): the
        host's `threads`, else its CPUs divided among every torch worker whose CPUs overlap them (a host without a
        cpuset, or a torch kind no host names, overlaps everything), at least 1. So on 2 cores the embedded
        decode and trainer workers get one thread each, and two busy ones never oversubscribe. `decode_replicas`:
        the decode workers the embedded stack starts on the decode host's CPUs (each one more sharer there)."""
        if host is not None and host.threads is not None:
            return host.threads
        every = set(range(cpu_count))

        def cpus_of(h: HostConfig | None) -> set[int]:
            return set(parse_cpuset(h.cpus)) if h is not None and h.cpus else every

        mine = cpus_of(host)
        sharing = sum(1 for k in TORCH_KINDS if self.host_of(k) is None and not self._named_by_pool(k))
        sharing += sum(sum(k in TORCH_KINDS for k in h.kinds()) for h in self.hosts if cpus_of(h) & mine)
        if cpus_of(self.host_of("decode")) & mine:
            sharing += decode_replicas - 1
        return max(1, len(mine) // max(1, sharing))

    def with_defaults(self, declared: dict[str, list[str]]) -> HardwareConfig:
        """These hosts plus one host for each thing no host runs (`unplaced`): a kind whose pools are all unplaced
        gets one host named after the kind, a single unplaced pool a host `kind-pool`. With no hosts at all this
        is the default layout of `trajflow up --hosts`: one host per worker kind."""
        missing = self.unplaced(declared)
        taken = {h.name for h in self.hosts}
        extra: list[HostConfig] = []

        def add(name: str, runs: list[str]) -> None:
            name = re.sub(r"[^a-z0-9-]", "-", name.lower())[:36]
            while name in taken:
                name += "-x"
            taken.add(name)
            extra.append(HostConfig(name=name, runs=runs))

        for kind in WORKER_KINDS:
            mine = [m for m in missing if m == kind or m.startswith(f"{kind}:")]
            if kind in POOL_KINDS and mine and len(mine) == len(declared[kind]):
                add(kind, [kind])
            else:
                for entry in mine:
                    add(entry.replace(":", "-"), [entry])
        return HardwareConfig(hosts=[*self.hosts, *extra])

    def _named_by_pool(self, kind: str) -> bool:
        return any(r.startswith(f"{kind}:") for h in self.hosts for r in h.runs)
