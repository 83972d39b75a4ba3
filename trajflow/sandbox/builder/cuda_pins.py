"""The CUDA build of torch for the worker image's `--cuda` variant: PyPI's `torch==2.13.0` for Linux x86_64 and
its CUDA-only closure (CUDA 13.0: `cuda-toolkit`'s `nvidia-*` libraries, cuDNN, cuSPARSELt, NCCL, NVSHMEM,
`cuda-bindings` and `triton`), pinned by version and sha256.

The CPU worker image takes `torch==2.13.0+cpu` from the local wheel directory; the CUDA image swaps that one pin for
`CUDA_TORCH` and adds `CUDA_PINS`, everything else staying the CPU closure's. These are exactly what torch 2.13.0's
wheel requires under the marker `platform_system == "Linux"` (the CPU wheel requires the same rest), as pip resolved
them from PyPI on 2026-11-27 for CPython 3.11 on manylinux x86_64 (`pip install --dry-run --ignore-installed
--report`, pip's configuration off).

Limits: fixed for torch 2.13.0, CPython 3.11 and Linux x86_64 (every wheel here is manylinux_2_28 or older, so
Debian 12's glibc 2.36 loads them); a new torch needs a new resolution by hand (the comment above says how). The
wheels bring their own CUDA user-space libraries, so a GPU host needs only the NVIDIA driver (one that supports CUDA
13.0) and Docker's GPU support (`--gpus`).
"""

from __future__ import annotations

CUDA_TORCH = "torch==2.13.0"
"""PyPI's default torch wheel for Linux x86_64, the CUDA 13.0 build (no local version label)."""

CUDA_PINS: dict[str, str] = {
    "cuda-bindings==13.5.0": "08b7e8d674c3266facb00453a7e34ea7d3ea965c2f594bb728f269f45f39fbe2",
    "cuda-pathfinder==1.9.1": "b743c132f90ad2d1e71d43fd28f31ebcde518f943e50fd44aca62b2a80d5230d",
    "cuda-toolkit==13.0.3.0": "d693caaa261214ddd7dbb60d68e71cbed884e68c2be7509778f3051da0b91c3f",
    "nvidia-cublas==13.1.1.3": "37936a16db8fe4ac1f065c2139360608a543a09275cb1a1af612e08cfa065436",
    "nvidia-cuda-cupti==13.0.85": "4eb01c08e859bf924d222250d2e8f8b8ff6d3db4721288cf35d14252a4d933c8",
    "nvidia-cuda-nvrtc==13.0.88": "ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575",
    "nvidia-cuda-runtime==13.0.96": "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548",
    "nvidia-cudnn-cu13==9.20.0.48": "0c45dd8eeb50b603f07995b1b300c62ffe6a1980482b82b3bcf94a4ca9d49304",
    "nvidia-cufft==12.0.0.61": "6c44f692dce8fd5ffd3e3df134b6cdb9c2f72d99cf40b62c32dde45eea9ddad3",
    "nvidia-cufile==1.15.1.6": "08a3ecefae5a01c7f5117351c64f17c7c62efa5fffdbe24fc7d298da19cd0b44",
    "nvidia-curand==10.4.0.35": "1aee33a5da6e1db083fe2b90082def8915f30f3248d5896bcec36a579d941bfc",
    "nvidia-cusolver==12.0.4.66": "0a759da5dea5c0ea10fd307de75cdeb59e7ea4fcb8add0924859b944babf1112",
    "nvidia-cusparse==12.6.3.3": "2b3c89c88d01ee0e477cb7f82ef60a11a4bcd57b6b87c33f789350b59759360b",
    "nvidia-cusparselt-cu13==0.8.1": "786ce87568c303fadb5afcc7102d454cd3040d75f6f8626f5db460d1871f4dd0",
    "nvidia-nccl-cu13==2.29.7": "edd81538446786ec3b73972543e53bb43bcaf0bfc8ef76cb679fcc390ffe136d",
    "nvidia-nvjitlink==13.5.37": "280d7cb9649704145f074b8dbde500de04ce02d0872e066e20a83c17bcaa93eb",
    "nvidia-nvshmem-cu13==3.4.5": "290f0a2ee94c9f3687a02502f3b9299a9f9fe826e6d0287ee18482e78d495b80",
    "nvidia-nvtx==13.0.85": "4936d1d6780fbe68db454f5e72a42ff64d1fd6397df9f363ae786930fd5c1cd4",
    CUDA_TORCH: "60fcdcb2f3876e21146cb4524ef06397d727ca9ad5f020818547e25075fe3cb7",
    "triton==3.7.1": "6744957e9fd610a29680ec2346057d0c86948ed3812468670719f391e94b44a5",
}
"""{`name==version`: the sha256 of its one wheel for CPython 3.11 on Linux x86_64}, torch's included."""


def cuda_closure(cpu_closure: tuple[str, ...]) -> tuple[str, ...]:
    """The CPU closure with its torch pin replaced by the CUDA build's and the CUDA-only pins added, sorted."""
    rest = [r for r in cpu_closure if not r.startswith("torch==")]
    if len(rest) != len(cpu_closure) - 1:
        raise ValueError("the CPU closure pins torch exactly once")
    return tuple(sorted({*rest, *CUDA_PINS}))
