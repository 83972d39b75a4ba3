"""trajflow.rl.precision: bf16 only where the hardware runs it natively (decided from injected CPU features, so every
case runs on any machine), forced dtypes kept with an honest reason, and the config's "auto" defaults."""

from __future__ import annotations

import pytest

from trajflow.contracts.config import ModelConfig
from trajflow.contracts.training import TrainerConfig
from trajflow.rl.precision import (
    ASSUME_NATIVE_BF16_ENV,
    ASSUMED_BF16_FLAG,
    CpuInfo,
    assume_native_bf16,
    autocast_precision,
    choose_precision,
    cpuinfo_flags,
    detect_cpu,
    resolve_dtype,
)

AVX2 = CpuInfo("AVX2", frozenset({"avx", "avx2", "fma3"}))
AVX512_NO_BF16 = CpuInfo("AVX512", frozenset({"avx2", "avx512_f", "avx512_bw", "avx512_vnni"}))
AVX512_BF16 = CpuInfo("AVX512", frozenset({"avx2", "avx512_f", "avx512_bf16"}))
AMX = CpuInfo("AVX512", frozenset({"avx512_f", "amx_tile", "amx_bf16"}))
ARM_BF16 = CpuInfo("SVE256", frozenset({"neon", "sve", "bf16"}))
ARM_PLAIN = CpuInfo("DEFAULT", frozenset({"neon"}))


@pytest.mark.parametrize(
    ("cpu", "dtype"),
    [
        (AVX2, "float32"),
        (AVX512_NO_BF16, "float32"),  # AVX512 alone does not make bf16 native
        (AVX512_BF16, "bfloat16"),
        (AMX, "bfloat16"),
        (ARM_BF16, "bfloat16"),
        (ARM_PLAIN, "float32"),
    ],
)
def test_cpu_choice_follows_native_bf16(cpu: CpuInfo, dtype: str) -> None:
    chosen = choose_precision("cpu", cpu=cpu)
    assert chosen.dtype == dtype
    assert cpu.capability in chosen.reason  # the reason names the CPU capability


def test_the_reason_says_why_float32() -> None:
    chosen = choose_precision("cpu", cpu=AVX2)
    assert chosen.describe().startswith("precision: float32 — this CPU (AVX2) has no native bf16")
    assert "emulated" in chosen.reason
    assert "AMX-BF16" in choose_precision("cpu", cpu=AMX).reason


@pytest.mark.parametrize(("native", "dtype"), [(True, "bfloat16"), (False, "float32")])
def test_cuda_choice_follows_the_gpu(native: bool, dtype: str) -> None:
    # the CPU is never consulted for a CUDA device
    assert choose_precision("cuda:0", cpu=AVX2, cuda_bf16=native).dtype == dtype


def test_forced_dtypes_are_kept_and_say_so() -> None:
    forced = resolve_dtype("bfloat16", "cpu", cpu=AVX2)
    assert forced.dtype == "bfloat16" and "forced" in forced.reason and "emulated" in forced.reason
    assert resolve_dtype("float32", "cpu", cpu=AMX).dtype == "float32"
    assert resolve_dtype("auto", "cpu", cpu=AMX).dtype == "bfloat16"
    with pytest.raises(ValueError):
        resolve_dtype("float16", "cpu", cpu=AVX2)


@pytest.mark.parametrize(
    ("setting", "cpu", "bf16"),
    [("auto", AVX2, False), ("auto", AMX, True), ("bf16", AVX2, True), ("off", AMX, False)],
)
def test_autocast_settings(setting: str, cpu: CpuInfo, bf16: bool) -> None:
    assert autocast_precision(setting, "cpu", cpu=cpu).bf16 is bf16


def test_cpuinfo_flags_reads_x86_and_arm() -> None:
    x86 = "processor\t: 0\nflags\t\t: fpu avx2 AVX512_BF16 amx_bf16\nbogomips\t: 1\n"
    assert cpuinfo_flags(x86) == {"fpu", "avx2", "avx512_bf16", "amx_bf16"}
    assert cpuinfo_flags("Features\t: fp asimd bf16\n") == {"fp", "asimd", "bf16"}
    assert cpuinfo_flags("nothing here") == frozenset()


def test_detect_cpu_on_this_machine_is_consistent() -> None:
    cpu = detect_cpu()
    assert cpu.capability  # whatever it is, the decision must follow the flags torch reports
    assert choose_precision("cpu", cpu=cpu).bf16 == bool(cpu.native_bf16)


def test_assume_native_bf16_makes_auto_pick_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """The testing aid: an AVX2 CPU counts as native-bf16, and the reason says it was assumed."""
    assert assume_native_bf16({ASSUME_NATIVE_BF16_ENV: "1"}) and not assume_native_bf16({ASSUME_NATIVE_BF16_ENV: "0"})
    assumed = CpuInfo("AVX2", AVX2.flags | {ASSUMED_BF16_FLAG})
    chosen = choose_precision("cpu", cpu=assumed)
    assert chosen.dtype == "bfloat16" and ASSUME_NATIVE_BF16_ENV in chosen.reason and "emulated" in chosen.reason
    assert autocast_precision("auto", "cpu", cpu=assumed).bf16
    monkeypatch.setenv(ASSUME_NATIVE_BF16_ENV, "1")
    assert ASSUMED_BF16_FLAG in detect_cpu().flags and choose_precision("cpu").bf16
    monkeypatch.setenv(ASSUME_NATIVE_BF16_ENV, "")
    assert ASSUMED_BF16_FLAG not in detect_cpu().flags


def test_configs_default_to_auto_and_read_the_legacy_autocast_flag() -> None:
    assert ModelConfig().dtype == "auto" and TrainerConfig().autocast == "auto"
    assert TrainerConfig.model_validate({"autocast_bf16": True}).autocast == "bf16"
    assert TrainerConfig.model_validate({"autocast_bf16": False}).autocast == "off"  # recorded histories
    with pytest.raises(ValueError):
        TrainerConfig.model_validate({"autocast": "fp16"})
