"""Test configuration.

TRITON_INTERPRET=1 must be set before any Triton kernel module is imported (it is read at
``@triton.jit`` time) so that kernels run on CPU tensors in the interpreter.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (run `make test-gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
