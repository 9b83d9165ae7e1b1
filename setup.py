"""Builds pycomm's extension (pycomm._C) with torch.utils.cpp_extension and ninja.

The core (csrc/core) is plain C++17; the adapter (csrc/torch) is the only code that includes torch.
A CUDA extension is built when torch has CUDA and nvcc is found; a CPU-only one otherwise.
"""

from __future__ import annotations

import glob
import os

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import (
    CUDA_HOME,
    BuildExtension,
    CppExtension,
    CUDAExtension,
)

ROOT = os.path.dirname(os.path.abspath(__file__))
CXX_FLAGS = ["-O3", "-std=c++17", "-ffp-contract=off", "-Wno-unused-parameter"]


def sources() -> list[str]:
    found = sorted(glob.glob("csrc/core/**/*.cc", recursive=True))
    found += sorted(glob.glob("csrc/torch/*.cc"))
    return found


def with_cuda() -> bool:
    """CUDA kernels are built in when torch has CUDA and nvcc is there (PYCOMM_NO_CUDA=1 says no)."""
    if os.environ.get("PYCOMM_NO_CUDA") == "1":
        return False
    return torch.version.cuda is not None and CUDA_HOME is not None and os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc"))


def extension() -> CppExtension:
    if not with_cuda():
        return CppExtension(
            name="pycomm._C",
            sources=sources(),
            include_dirs=[os.path.join(ROOT, "csrc")],
            extra_compile_args={"cxx": CXX_FLAGS},
        )
    return CUDAExtension(
        name="pycomm._C",
        sources=sources() + sorted(glob.glob("csrc/cuda/*.cu")) + sorted(glob.glob("csrc/cuda/*.cc")),
        include_dirs=[os.path.join(ROOT, "csrc")],
        define_macros=[("PYCOMM_WITH_CUDA", "1")],
        libraries=["dl"],  # NCCL is loaded at run time (csrc/cuda/nccl_library.cc)
        extra_compile_args={"cxx": CXX_FLAGS, "nvcc": ["-O3", "-std=c++17"]},
    )


setup(
    name="pycomm",
    version="0.1.0",
    description="Collective communication for PyTorch: a torch.distributed backend with its own core",
    packages=find_packages(include=["pycomm", "pycomm.*"]),
    package_data={"pycomm": ["py.typed", "*.pyi", "tuning_data/*.json"]},
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    python_requires=">=3.10",
    install_requires=["torch>=2.4"],
)
