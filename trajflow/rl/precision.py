"""Which floating-point precision the hardware runs natively: bfloat16 where it is fast, float32 where bf16 would
be emulated. One decision, used for decode weights (`ModelConfig.dtype = "auto"`) and the trainer's autocast
(`TrainerConfig.autocast = "auto"`), and reported with its reason so a run says what it chose and why.

- CUDA: bfloat16 when the GPU computes it natively (Ampere and newer), else float32.
- x86 CPU: bfloat16 only with AVX512-BF16 or AMX-BF16. Without them torch emulates bf16. Measured on a shared
  2-core AVX2-only AMD EPYC (2026-11-23): a bf16 matmul 2.3 GFLOP/s against 84 in float32 (one thread);
  SmolLM2-135M HF decode at batch 16 27-28 tok/s in float32 against 5-11 in bfloat16; one trainer step of
  8 x 128 tokens (last 8 blocks trained) 9 s in float32 against 242 s under bf16 autocast.
- ARM CPU: bfloat16 with the BF16 extension (`bf16` / `sve_bf16`), else float32.

The CPU's features come from `torch.cpu.get_capabilities()` (the cpuinfo library torch ships), or from the
`flags`/`Features` lines of /proc/cpuinfo on a torch without it; every function takes them injected, so the
decision is tested without the hardware. torch is imported only by `detect_cpu` and `choose_precision` when
nothing is injected.

Testing aid: `TRAJFLOW_ASSUME_NATIVE_BF16=1` in the environment makes `detect_cpu` count this CPU as one with
native bf16, so every "auto" above picks bfloat16, as on an AVX512-BF16/AMX machine. It exercises that path (and its
numerics) on a CPU without them, where bf16 is emulated and slow; it is read by every process, workers included.

Not covered: float16 (never chosen), speed probes (the decision is by feature flags, not by timing), and
CPUs whose bf16 support is present but slow in a given torch build.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

DType = Literal["float32", "bfloat16"]

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16", "sve_bf16"})
"""CPU features with bf16 arithmetic in hardware (x86: AVX512-BF16, AMX; ARM: BF16, SVE-BF16)."""
ASSUME_NATIVE_BF16_ENV = "TRAJFLOW_ASSUME_NATIVE_BF16"
"""Set to 1 (true, yes), `detect_cpu` adds `ASSUMED_BF16_FLAG`: a testing aid (see the module docstring)."""
ASSUMED_BF16_FLAG = "assumed_native_bf16"
"""The pseudo-feature `ASSUME_NATIVE_BF16_ENV` adds; it counts as native bf16."""


@dataclass(frozen=True)
class CpuInfo:
    """What torch dispatches to on this CPU, and its features."""

    capability: str
    """`torch.backends.cpu.get_cpu_capability()`: the vector ISA torch's kernels use ("AVX2", "AVX512", ...)."""
    flags: frozenset[str]
    """Feature names, lower case, in torch's / the kernel's spelling ("avx512_bf16", "amx_bf16", "bf16", ...)."""

    @property
    def native_bf16(self) -> frozenset[str]:
        return self.flags & (NATIVE_BF16_FLAGS | {ASSUMED_BF16_FLAG})


@dataclass(frozen=True)
class Precision:
    dtype: DType
    reason: str
    """One sentence naming the hardware capability that decided it."""

    @property
    def bf16(self) -> bool:
        return self.dtype == "bfloat16"

    def describe(self) -> str:
        return f"precision: {self.dtype} — {self.reason}"


def cpuinfo_flags(text: str) -> frozenset[str]:
    """Feature flags from /proc/cpuinfo text (x86 `flags`, ARM `Features`), lower case."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.lower().split())
    return frozenset()


def assume_native_bf16(environ: Mapping[str, str] | None = None) -> bool:
    """Whether `ASSUME_NATIVE_BF16_ENV` is set to a true value in `environ` (None: this process's environment)."""
    value = (os.environ if environ is None else environ).get(ASSUME_NATIVE_BF16_ENV, "")
    return value.strip().lower() in ("1", "true", "yes")


def detect_cpu() -> CpuInfo:
    """This machine's CPU as torch sees it (imports torch), plus `ASSUMED_BF16_FLAG` when `assume_native_bf16()`."""
    import torch

    capability = str(torch.backends.cpu.get_cpu_capability())
    get_capabilities = getattr(torch.cpu, "get_capabilities", None)  # torch >= 2.10
    if get_capabilities is not None:
        flags = frozenset(str(k).lower() for k, v in get_capabilities().items() if v is True)
    else:
        path = Path("/proc/cpuinfo")
        flags = cpuinfo_flags(path.read_text()) if path.exists() else frozenset()
    if assume_native_bf16():
        flags |= {ASSUMED_BF16_FLAG}
    return CpuInfo(capability=capability, flags=flags)


def _names(flags: Iterable[str]) -> str:
    return "/".join(sorted(f.upper().replace("_", "-") for f in flags))


def cpu_precision(cpu: CpuInfo) -> Precision:
    """bfloat16 when the CPU has bf16 arithmetic in hardware, else float32 (see the module docstring)."""
    native = cpu.native_bf16
    if native == {ASSUMED_BF16_FLAG}:
        return Precision(
            "bfloat16",
            f"{ASSUME_NATIVE_BF16_ENV} is set: this CPU ({cpu.capability}) counts as running bf16 natively, "
            "although it has no AVX512-BF16 or AMX (bf16 is emulated: slow)",
        )
    if native:
        names = _names(native - {ASSUMED_BF16_FLAG})
        return Precision("bfloat16", f"this CPU ({cpu.capability}, {names}) runs bf16 natively")
    return Precision(
        "float32",
        f"this CPU ({cpu.capability}) has no native bf16 (no AVX512-BF16 or AMX); bf16 would be emulated, "
        "~30x slower in matmuls",
    )


def choose_precision(device: str = "cpu", *, cpu: CpuInfo | None = None, cuda_bf16: bool | None = None) -> Precision:
    """The native precision of `device` ("cpu", "cuda", "cuda:1", ...). `cpu` / `cuda_bf16` inject the hardware
    (tests); None detects it."""
    if device.startswith("cuda"):
        if cuda_bf16 is None:
            import torch

            with torch.cuda.device(torch.device(device)):  # cuda:N: that GPU's answer, not the current one's
                cuda_bf16 = bool(torch.cuda.is_bf16_supported(including_emulation=False))
        if cuda_bf16:
            return Precision("bfloat16", "the CUDA GPU runs bf16 natively")
        return Precision("float32", "the CUDA GPU has no native bf16 (older than Ampere)")
    return cpu_precision(cpu if cpu is not None else detect_cpu())


def resolve_dtype(
    requested: str, device: str = "cpu", *, cpu: CpuInfo | None = None, cuda_bf16: bool | None = None
) -> Precision:
    """`requested` "auto" is `choose_precision`; "float32" / "bfloat16" are kept, with a reason that says so
    (and warns when bfloat16 is forced where it would be emulated)."""
    if requested == "auto":
        return choose_precision(device, cpu=cpu, cuda_bf16=cuda_bf16)
    if requested not in ("float32", "bfloat16"):
        raise ValueError(f"unknown dtype {requested!r}; expected 'auto', 'float32' or 'bfloat16'")
    native = choose_precision(device, cpu=cpu, cuda_bf16=cuda_bf16)
    if requested == "bfloat16" and not native.bf16:
        return Precision("bfloat16", f"forced by the config, although {native.reason}")
    forced: DType = "bfloat16" if requested == "bfloat16" else "float32"
    return Precision(forced, f"forced by the config ({native.dtype} would be the automatic choice)")


def autocast_precision(
    setting: str, device: str = "cpu", *, cpu: CpuInfo | None = None, cuda_bf16: bool | None = None
) -> Precision:
    """The trainer's autocast (`TrainerConfig.autocast`): "auto" is bf16 where `device` runs it natively, "bf16"
    forces it on, "off" off. The result's dtype is the matmul precision (bfloat16 = autocast on)."""
    if setting == "off":
        return Precision("float32", "bf16 autocast is off in the config")
    if setting == "bf16":
        return resolve_dtype("bfloat16", device, cpu=cpu, cuda_bf16=cuda_bf16)
    if setting != "auto":
        raise ValueError(f"unknown autocast {setting!r}; expected 'auto', 'bf16' or 'off'")
    return choose_precision(device, cpu=cpu, cuda_bf16=cuda_bf16)
