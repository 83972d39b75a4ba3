"""Process settings from the environment (`TRAJFLOW_*`): addresses, ports, directories, store, credentials.

These describe *where* things run, never *what* a run does (that is `contracts.config.RunConfig`), and they
never enter workflow history. Defaults give the embedded stack: everything on 127.0.0.1 under one state dir.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRAJFLOW_", extra="ignore", frozen=True)

    state_dir: Path = Field(default_factory=lambda: Path.home() / ".trajflow")
    """Root of everything the embedded stack keeps: Temporal's database, logs, pids, store, model cache."""
    temporal_address: str = "127.0.0.1:7233"
    """host:port of the Temporal frontend (the dev server's by default)."""
    temporal_namespace: str = "default"
    temporal_ui_port: int = 8233
    """Port of the dev server's Web UI; 0 disables the UI."""
    reward_host: str = "127.0.0.1"
    reward_port: int = 8711
    reward_url: str | None = None
    """Where reward workers reach the reward service; defaults to http://reward_host:reward_port."""
    reward_timeout_s: float = 10.0
    device: str = "auto"
    """Where this process's decode engine or trainer computes: `auto` (a GPU when one is visible), `cpu`, `cuda`,
    `cuda:N`. Launchers set it from the run config's hardware section (`infra.placement`)."""
    threads: int | None = None
    """torch intra-op threads of this process; None: torch's own default. Launchers set it from the hardware
    section, so that busy workers sharing cores never oversubscribe them."""
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
    sandbox_network: bool = False
    """Give sandboxes a network (off by default: no network inside containers)."""
    sandbox_mem_limit: str = "1g"
    sandbox_cpus: float = 1.0
    sandbox_pids_limit: int = 256
    sandbox_step_timeout_s: float = 60.0
    sandbox_warm_pool: int = 4
    """Started sandboxes kept waiting per env (per env hint) on each env worker; 0 turns the warm pool off."""

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
    def temporal_db(self) -> Path:
        return self.state_dir / "temporal" / "temporal.db"


def load_settings() -> Settings:
    return Settings()
