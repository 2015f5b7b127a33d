"""Triton kernels with plain-torch references (one op per file).

Each ``foxdqn/ops/<op>.py`` holds the kernel(s), the launcher, ``<op>_reference`` and the public
``<op>(..., backend="auto")`` that runs the kernel for CUDA tensors and the reference for CPU
tensors (the choice and the interpreter check: :mod:`foxdqn.ops.backend`). The host-side objects
that own the guard's state are in :mod:`foxdqn.population` (member_guard.py). Import the op modules
directly (``from foxdqn.ops.c51_project import c51_project``); this package does not import
Triton eagerly.
"""
