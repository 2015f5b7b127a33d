"""Test configuration.

Without CUDA, TRITON_INTERPRET=1 is set before any Triton kernel module is imported (it is read
at ``@triton.jit`` time) so that kernels run on CPU tensors in Triton's interpreter. With CUDA the
kernels compile for the GPU; tests marked ``gpu`` run only there.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (run `make test-gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
