"""Process settings from the environment (`TRAJFLOW_*`): addresses, ports, directories, store, credentials.

These describe *where* things run, never *what* a run does (that is `trajflow.contracts.config.RunConfig`), and they
never enter workflow history. Defaults give the embedded stack: everything on 127.0.0.1 under one state dir.

Temporal: embedded or a cluster. With no `TRAJFLOW_TEMPORAL_*` variable set, `trajflow up` starts the dev server at
127.0.0.1:7233 (the embedded stack). It starts none, and every process uses the server it is pointed at as it is,
when the settings describe a cluster: TLS is on (`TEMPORAL_TLS`, any `TEMPORAL_TLS_*_FILE`, or an API key, which
implies TLS), or the address's host is not a loopback one (not `localhost`, 127.0.0.0/8 or ::1).
`TRAJFLOW_TEMPORAL_DEV_SERVER=true|false` overrides the rule (e.g. a plaintext cluster on this machine: false).
How these settings become a client and what a failed connection says: `trajflow.infra.connection`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from trajflow.rewards.bounded import DEFAULT_TIMEOUT_S as DEFAULT_VERIFIER_TIMEOUT_S


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRAJFLOW_", extra="ignore", frozen=True)

    state_dir: Path = Field(default_factory=lambda: Path.home() / ".trajflow")
    """Root of everything the embedded stack keeps: Temporal's database, logs, pids, store, model cache."""
    temporal_address: str = "127.0.0.1:7233"
    """host:port of the Temporal frontend (the dev server's by default)."""
    temporal_namespace: str = "default"
    """Namespace of every client and worker (Temporal Cloud: `NAMESPACE.ACCOUNT`)."""
    temporal_tls: bool = False
    """Connect with TLS, verifying the server against the system's root CAs (a cluster with a publicly signed
    certificate). Implied by any of the TLS files below and by an API key."""
    temporal_tls_ca_file: Path | None = None
    """PEM file of the CA(s) that signed the server's certificate, instead of the system's root CAs."""
    temporal_tls_cert_file: Path | None = None
    """PEM client certificate for mutual TLS (Temporal Cloud's mTLS namespaces, a self-hosted cluster that
    requires one); needs `temporal_tls_key_file`."""
    temporal_tls_key_file: Path | None = None
    """PEM private key of `temporal_tls_cert_file`."""
    temporal_tls_server_name: str | None = None
    """Name to send as SNI and to verify the server's certificate against, when it differs from the address's host
    (e.g. connecting by IP to a server whose certificate names a host)."""
    temporal_api_key: SecretStr | None = None
    """API key (Temporal Cloud); sent as `authorization: Bearer KEY` on every call, always over TLS."""
    temporal_dev_server: bool | None = None
    """Whether `trajflow up` starts the dev server; unset: the rule in this module's docstring."""
    temporal_ui_port: int = 8233
    """Port of the dev server's Web UI; 0 disables the UI."""
    reward_host: str = "127.0.0.1"
    reward_port: int = 8711
    reward_url: str | None = None
    """Where reward workers reach the reward service; defaults to http://reward_host:reward_port."""
    reward_timeout_s: float = 10.0
    run_sweep_s: float = Field(default=15.0, ge=0)
    """How often the orchestrator worker looks for running trajectories of training runs that ended early
    (terminated, cancelled, failed, timed out) and cancels them (`workers/run_sweep.py`); 0 turns the sweep off."""
    verifier_timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = DEFAULT_VERIFIER_TIMEOUT_S
    """The reward service's time limit of one verifier call (a bounded reward function: `math_verify`, your own), in
    seconds; past it the call's worker process is killed and the trajectory ends `failed`, never scored
    (`trajflow.rewards.bounded`). Keep it below `reward_timeout_s`, so a timeout comes back as itself."""
    device: str = "auto"
    """Where this process's decode engine or trainer computes: `auto` (a GPU when one is visible), `cpu`, `cuda`,
    `cuda:N`. Launchers set it from the run config's hardware section (`trajflow.infra.placement`)."""
    threads: int | None = None
    """torch intra-op threads of this process; None: torch's own default. Launchers set it from the hardware
    section, so that busy workers sharing cores never oversubscribe them."""
    expect_gpus: int | None = None
    """How many GPUs the host this worker was placed on was given (its `gpus`); the decode and trainer workers fail
    at start when they see fewer (`trajflow.rl.devices.require_gpus`), rather than compute on the CPU. Launchers set
    it with the placement (`trajflow.infra.placement`); None: nothing is expected."""
    gpus_given: bool = False
    """This process runs in a container that its launcher already gave its host's GPUs (a Docker device request, a
    pod's GPU limit), which shows them renumbered from 0: `trajflow worker host` then gives its workers the
    container's own GPU ids, not the config's `gpus`, which name the machine's
    (`trajflow.infra.placement.worker_env_on`). `trajflow up --hosts` sets it in every host container."""
    hardware_host: str | None = None
    """The name of the run config's `[[hardware.hosts]]` entry this worker was placed on, for errors about it."""
    host_name: str | None = None
    """The host this worker runs as, when a launcher placed it (`trajflow up --hosts` sets the container's name,
    unique on its Docker engine); labelled on sandboxes so a restarted env host reaps its predecessor's."""
    hosts_prefix: str = "trajflow"
    """`trajflow up --hosts`: the prefix of its containers' names (`<prefix>-<host>`), its network and labels."""
    hosts_s3_port: int = 8712
    """`trajflow up --hosts` without an S3 `store_url`: the port of the moto_server it starts as the store."""
    run_config: str | None = None
    """A run config's TOML text, for worker commands started without `--config` (how `trajflow up --hosts`
    hands any config to a container that shares no filesystem with the user)."""
    vllm_python: Path | None = None
    """The Python of the vLLM venv, for decode workers of a config with `engine = "vllm"`; default
    `.vllm-venv/bin/python` beside the running venv (what `make vllm-venv` builds)."""
    openai_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("TRAJFLOW_OPENAI_API_KEY", "OPENAI_API_KEY")
    )
    """Bearer token for the inference server of a config with `engine = "openai"` (`TRAJFLOW_OPENAI_API_KEY`,
    else `OPENAI_API_KEY`); none: requests carry no Authorization header."""
    store_url: str | None = None
    """`file:///path` or `s3://bucket/prefix`; defaults to a directory under state_dir."""
    s3_endpoint_url: str | None = None
    """S3 endpoint for non-AWS stores (moto, MinIO); credentials come from the usual AWS_* variables."""
    s3_region: str = "us-east-1"
    s3_create_bucket: bool = False
    metrics_port: int | None = None
    """This worker's Prometheus `/metrics` port (the SDK's metrics and trajflow's, `trajflow.observability.metrics`);
    None: it serves none. `trajflow up` gives each worker its own."""
    metrics_host: str = "127.0.0.1"
    """The address a worker's `/metrics` listens on (`0.0.0.0` in a host's container)."""
    prometheus_port: int = 9090
    """Port of the Prometheus `trajflow up` starts (UI and HTTP API); 0: none is started and workers serve no
    metrics."""
    temporal_metrics_port: int | None = None
    """The dev server's own Prometheus metrics port; None: `trajflow up` picks a free one when it starts Prometheus."""
    traces: bool = True
    """Workers trace every trajectory with OpenTelemetry (`trajflow.observability.tracing`): over OTLP when
    `otlp_endpoint` is set, else to JSON-lines files under `traces_dir` that `trajflow trace` reads; false: no spans at
    all."""
    trace_dir: Path | None = None
    """Where the workers' span files go; None: `traces` under the state dir (`trajflow up --hosts` points every
    host container at the machine's, mounted)."""
    otlp_endpoint: str | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "TRAJFLOW_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"
        ),
    )
    """An OTLP/HTTP collector for the spans (`TRAJFLOW_OTLP_ENDPOINT`, else OpenTelemetry's own
    `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`), e.g. `http://127.0.0.1:4318`; the
    path `/v1/traces` is added when the URL has none. None: spans go to `traces_dir`."""
    sandbox_network: bool = False
    """Give sandboxes a network (off by default: no network inside containers)."""
    sandbox_mem_limit: str = "1g"
    sandbox_cpus: float = 1.0
    sandbox_pids_limit: int = 256
    sandbox_step_timeout_s: float = 60.0
    sandbox_warm_pool: int = 4
    """Started sandboxes kept waiting per env (per env hint) on each env worker; 0 turns the warm pool off."""
    sandbox_warm_unused_s: float = Field(default=600.0, gt=0)
    """An env nobody asked for in this long loses its waiting sandboxes and is refilled no more until asked again
    (`trajflow.sandbox.pool.WarmPool.forget_unused`, run by the env worker's sweep)."""
    sandbox_warm_max: int = Field(default=32, ge=0)
    """The most sandboxes one env worker keeps waiting or starting for all envs together."""
    sandbox_reuse: int = Field(default=16, ge=1)
    """How many trajectories one sandbox may serve, one after another, when its env's actions are text the env
    parses and never code it runs (GEM's games, puzzles, math and QA, `gym:`, `data:`; `trajflow.sandbox.pool`):
    the runner builds the env anew at each reset, and a reuse skips a container's start and stop. 1: every trajectory
    gets a fresh container. Shell tasks, agent programs, `py:` envs and code envs always get a fresh one."""
    sandbox_lease_s: float = Field(default=120.0, gt=0)
    """How long a sandbox may sit unused before the env worker's sweep asks Temporal whether its trajectory still runs
    (`trajflow/sandbox/leases.py`): past it, the sandbox of a terminated, reset or finished trajectory is removed
    (within about 1.25 leases of its last use); one unused for 10 leases is removed whatever Temporal says (a live
    trajectory then restores into a fresh sandbox by replay). Every env activity renews it. Set it well above the
    longest wait between two steps of one trajectory (decode, reward model) on the slowest machine."""

    @property
    def temporal_tls_enabled(self) -> bool:
        return bool(
            self.temporal_tls
            or self.temporal_tls_ca_file
            or self.temporal_tls_cert_file
            or self.temporal_tls_key_file
            or self.temporal_api_key
        )

    @property
    def temporal_embedded(self) -> bool:
        """Whether this machine runs the Temporal server itself (the dev server `trajflow up` starts and manages)
        rather than using a cluster; see the module docstring for the rule."""
        if self.temporal_dev_server is not None:
            return self.temporal_dev_server
        return not self.temporal_tls_enabled and is_loopback_host(self.temporal_address.rpartition(":")[0])

    @property
    def resolved_reward_url(self) -> str:
        return self.reward_url or f"http://{self.reward_host}:{self.reward_port}"

    @property
    def resolved_vllm_python(self) -> Path:
        import sys

        return self.vllm_python or Path(sys.prefix).parent / ".vllm-venv" / "bin" / "python"

    @property
    def resolved_store_url(self) -> str:
        return self.store_url or (self.state_dir / "store").resolve().as_uri()

    @property
    def cache_dir(self) -> Path:
        """Converted models, downloaded wheels, image build contexts."""
        return self.state_dir / "cache"

    @property
    def run_dir(self) -> Path:
        """Pid files of the processes `trajflow up` started."""
        return self.state_dir / "run"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def sandbox_dir(self) -> Path:
        """Per-sandbox directories bind-mounted into containers (the runner's socket lives there)."""
        return self.state_dir / "sandboxes"

    @property
    def traces_dir(self) -> Path:
        """One JSON-lines file of spans per worker process, when no OTLP endpoint is set
        (`trajflow.observability.tracing`)."""
        return self.trace_dir or self.state_dir / "traces"

    @property
    def temporal_db(self) -> Path:
        return self.state_dir / "temporal" / "temporal.db"


def is_loopback_host(host: str) -> bool:
    """`localhost`, 127.0.0.0/8 or ::1 (with or without brackets); names are not resolved."""
    import ipaddress

    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_settings() -> Settings:
    """The process settings from the `TRAJFLOW_*` environment variables (the embedded stack's defaults)."""
    return Settings()
