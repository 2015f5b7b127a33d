"""Which GPU each job of a parallel sweep runs on (``hydra/launcher=joblib``, docs/usage.md#gpus-of-parallel-jobs).

The sweep's process and its job processes do different halves of the work:

* **The sweep's process** (:class:`foxdqn.cli.callbacks.PlaceJobsOnGpus`, at ``on_multirun_start``)
  decides the sweep's GPUs, :func:`visible_gpus` of its own ``CUDA_VISIBLE_DEVICES`` and GPU count,
  and exports them as ``FOXDQN_SWEEP_GPUS`` (:data:`SWEEP_GPUS_ENV`); it sets the joblib launcher's
  ``n_jobs`` to their number when the user gave none, and the Ray launcher's ``num_gpus=1``.
* **Each job process** (:func:`place_sweep_job`, the first thing the task function of
  ``foxdqn.train`` does, before anything can initialise CUDA) takes one GPU with
  :func:`claim_gpu` and sets ``CUDA_VISIBLE_DEVICES`` to that GPU alone.

Why it is built this way:

1. *The claim belongs to the worker process, not to the job.* joblib's loky backend runs the jobs in
   ``n_jobs`` worker processes and gives each worker job after job. The CUDA driver reads
   ``CUDA_VISIBLE_DEVICES`` once, when it initialises in a process; after that a process cannot move
   to another GPU. So a worker claims a GPU at its first job and keeps it, with its later jobs, for
   its whole life (:func:`place_worker`). With ``n_jobs`` no larger than the number of GPUs (the
   default) every worker has a GPU of its own and no GPU ever runs two jobs. With more workers than
   GPUs, each GPU gets ``floor`` or ``ceil(n_jobs / GPUs)`` workers; a worker cannot move, so at the
   tail of such a sweep a GPU may run two jobs while another has finished its own.
2. *The job processes choose, not the sweep's process.* The sweep's process cannot know which
   worker runs a job: loky hands each job to whichever worker is free, so a rule such as
   ``job_num % GPUs`` puts two running jobs on one GPU as soon as jobs finish in another order than
   they started.
3. *Exclusive ``fcntl.flock`` locks on slot files count the holders.* Each GPU has slot files
   ``<slot folder>/gpu-<id>.<k>.lock``; a worker holds one for its life. The operating system
   releases a lock when its process exits, ``kill -9`` included, so no placement state is ever
   stale and nothing needs cleaning. Counting and taking happen under one more lock,
   ``choose.lock``, so two workers starting together see each other's claim.
4. *The slot folder is per user and machine, not per sweep* (:func:`default_slot_dir`, under the
   temporary folder): two sweeps running at once on one machine share the count, so the second one
   starts on the GPUs the first leaves idle instead of on GPU 0 again. GPU ids are the strings of
   ``CUDA_VISIBLE_DEVICES`` (indices, ``GPU-``/``MIG-`` UUIDs), so two sweeps that see different
   subsets of the GPUs (``0,1,2,3`` and ``2,3``) still count a GPU as one, as long as they spell
   its id the same way.
5. *A job process never counts GPUs.* ``torch.cuda.device_count()`` asks NVML first and does not
   initialise CUDA, but it falls back to ``cudaGetDeviceCount`` (which initialises the driver and
   fixes the process's GPUs) where NVML fails, for instance with MIG UUIDs; ``torch.cuda.is_available()``
   initialises the driver unless ``PYTORCH_NVML_BASED_CUDA_CHECK=1``. The sweep's process may already
   have initialised CUDA (the multirun precheck, :class:`foxdqn.cli.callbacks.CheckJobs`), which
   does not matter there, so it counts (:func:`gpu_count`) and passes the ids down through the
   environment: loky starts its workers by fork + exec with a copy of the parent's environment.
   What a job process relies on is that nothing before the first line of the task function
   (Hydra's ``execute_job``/``run_job``, unpickling the task function and the callbacks, importing
   torch, Triton and foxdqn) initialises CUDA; none of them does (tests/cli/test_placement.py checks
   the imports).
6. *``n_jobs`` is set by a callback, not by a config file.* Hydra 1.3 calls ``on_multirun_start``
   with the composed config before the sweeper instantiates the launcher from it, so the value set
   there is the one joblib gets. A ``conf/hydra/launcher/joblib.yaml`` with a resolver would be
   merged with the plugin's ConfigStore entry of the same name by Hydra's deprecated "automatic
   schema matching" (a deprecation warning on every sweep), and a ConfigStore entry stored by
   foxdqn would be overwritten when Hydra's plugin scan executes the plugin's config module again.
   The cost: the callback cannot tell a -1 written in a config file from the plugin's default, so
   only the command line can ask for -1 (all CPUs) on a GPU machine.

Nothing here imports torch at module level: job processes import this module before they may
touch CUDA, and the tests' spawned processes stay light.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence
from urllib.parse import quote

#: The sweep's GPU ids, comma-separated, exported by the sweep's process to its joblib workers.
SWEEP_GPUS_ENV = "FOXDQN_SWEEP_GPUS"

#: The claim of this process, once it has one (:func:`place_worker`).
_WORKER_CLAIM: "Claim | None" = None


def choose_gpu(holders: Sequence[int]) -> int:
    """The index of the least-loaded GPU: the fewest holders, the lowest index among equals.

    Args:
        holders: the number of processes holding each GPU now, one entry per GPU (ints >= 0).

    Returns:
        An index into ``holders``.

    Raises:
        ValueError: ``holders`` is empty or holds a negative count.
    """
    if len(holders) == 0:
        raise ValueError("choose_gpu: no GPUs (holders is empty)")
    if min(holders) < 0:
        raise ValueError(f"choose_gpu: holder counts must be >= 0, got {list(holders)}")
    return min(range(len(holders)), key=lambda i: (holders[i], i))


def visible_gpus(env: Mapping[str, str], device_count: int) -> list[str]:
    """The GPU ids a process with environment ``env`` sees, as ``CUDA_VISIBLE_DEVICES`` spells them.

    With ``CUDA_VISIBLE_DEVICES`` set: its comma-separated entries (indices or ``GPU-``/``MIG-``
    UUIDs), cut at the first empty one and at ``device_count`` (CUDA ignores an entry it cannot
    use and all after it, and torch's count says how many it uses): ``"3,5"`` with 2 GPUs gives
    ``["3", "5"]``. Unset: ``["0", ..., str(device_count - 1)]``.

    Args:
        env: the environment (``os.environ``, or a dict in tests).
        device_count: the number of GPUs CUDA shows under ``env`` (``torch.cuda.device_count()``).

    Returns:
        The ids, in CUDA's order; empty when there is no GPU.
    """
    if device_count <= 0:
        return []
    given = env.get("CUDA_VISIBLE_DEVICES")
    if given is None:
        return [str(i) for i in range(device_count)]
    ids: list[str] = []
    for entry in given.split(","):
        entry = entry.strip()
        if not entry or entry in ids:
            break
        ids.append(entry)
    return ids[:device_count]


def gpu_count() -> int:
    """The number of GPUs this process sees (``torch.cuda.device_count()``). Called in the sweep's
    process only (see the module docstring, point 5)."""
    import torch

    return torch.cuda.device_count()


def sweep_gpus(env: Mapping[str, str]) -> list[str]:
    """The GPU ids the sweep's process exported (:data:`SWEEP_GPUS_ENV`); empty when it exported
    none (a CPU sweep, no GPU, or no joblib launcher)."""
    return [g for g in env.get(SWEEP_GPUS_ENV, "").split(",") if g]


def launcher_kind(target: object) -> str | None:
    """``"joblib"``, ``"ray"`` or None from a launcher's ``_target_`` (``hydra.launcher._target_``).
    Only the local Ray launcher counts: ``ray_aws`` runs on machines whose GPUs this one does not see."""
    name = str(target or "").rsplit(".", 1)[-1]
    return {"JoblibLauncher": "joblib", "RayLauncher": "ray"}.get(name)


def default_slot_dir() -> Path:
    """The slot folder every sweep of this user on this machine shares:
    ``<temporary folder>/foxdqn-gpu-slots-<uid>`` (``TMPDIR`` moves it)."""
    return Path(tempfile.gettempdir()) / f"foxdqn-gpu-slots-{os.getuid()}"


@dataclass
class Claim:
    """A GPU held by this process until :meth:`release` or the process's exit.

    Attributes:
        gpu: the GPU's id, as ``CUDA_VISIBLE_DEVICES`` spells it.
        holders: how many processes held each of those GPUs just before this claim.
        slot: the slot file whose lock is held.
    """

    gpu: str
    holders: tuple[int, ...]
    slot: Path
    _fd: int | None = field(default=None, repr=False)

    def release(self) -> None:
        """Give the GPU back (closes the locked file; a second call does nothing)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None


def claim_gpu(slot_dir: str | os.PathLike[str], gpus: Sequence[str]) -> Claim:
    """Take the least-loaded of ``gpus`` (:func:`choose_gpu` over the holders counted in
    ``slot_dir``) by locking one of its slot files; the lock stays until :meth:`Claim.release` or
    the process exits. Does not touch ``CUDA_VISIBLE_DEVICES`` (:func:`place_worker` does).

    Args:
        slot_dir: the folder of slot files (made if missing); :func:`default_slot_dir` in sweeps.
        gpus: the GPU ids to choose from (distinct strings).

    Returns:
        The claim.

    Raises:
        ValueError: ``gpus`` is empty.
        OSError: the folder or a slot file cannot be made or opened.
    """
    import fcntl

    if not gpus:
        raise ValueError("claim_gpu: no GPUs to claim")
    folder = Path(slot_dir)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _exclusive(folder / "choose.lock"):
        counts = [_holders(folder, gpu) for gpu in gpus]
        index = choose_gpu(counts)
        k = 0
        while True:  # the lowest free slot of the chosen GPU (slots 0..k-1 exist once k does)
            slot = _slot(folder, gpus[index], k)
            fd = os.open(slot, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                k += 1
                continue
            return Claim(gpu=gpus[index], holders=tuple(counts), slot=slot, _fd=fd)


def place_worker(gpus: Sequence[str], slot_dir: str | os.PathLike[str] | None = None) -> Claim:
    """This process's GPU: at the first call :func:`claim_gpu` (in :func:`default_slot_dir` unless
    ``slot_dir`` is given) and ``os.environ["CUDA_VISIBLE_DEVICES"]`` set to the claimed id; later
    calls return the same claim (a process keeps its GPU: module docstring, point 1).

    Must run before anything in the process initialises CUDA.

    Raises:
        ValueError, OSError: as :func:`claim_gpu`.
    """
    global _WORKER_CLAIM
    if _WORKER_CLAIM is None:
        claim = claim_gpu(default_slot_dir() if slot_dir is None else slot_dir, gpus)
        os.environ["CUDA_VISIBLE_DEVICES"] = claim.gpu
        _WORKER_CLAIM = claim
    return _WORKER_CLAIM


def place_sweep_job(launcher_target: object, env: Mapping[str, str] | None = None) -> Claim | None:
    """In a job of a joblib sweep that the sweep's process placed on GPUs (``FOXDQN_SWEEP_GPUS`` in
    ``env``, default ``os.environ``): :func:`place_worker` over those GPUs. Anything else (another
    launcher, a CPU sweep): None, and nothing is changed.

    Args:
        launcher_target: the job's ``hydra.launcher._target_``.
        env: where to read the sweep's GPUs.

    Raises:
        ValueError, OSError: as :func:`claim_gpu`.
    """
    gpus = sweep_gpus(os.environ if env is None else env)
    if launcher_kind(launcher_target) != "joblib" or not gpus:
        return None
    return place_worker(gpus)


def _slot(folder: Path, gpu: str, k: int) -> Path:
    # the id percent-encoded, '.' too, so that no id's slot name can be read as another's
    return folder / f"gpu-{quote(gpu, safe='').replace('.', '%2E')}.{k}.lock"


def _holders(folder: Path, gpu: str) -> int:
    """How many of ``gpu``'s slot files are locked by some process (caller holds choose.lock)."""
    import fcntl

    held, k = 0, 0
    while (slot := _slot(folder, gpu, k)).exists():
        fd = os.open(slot, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held += 1
        finally:
            os.close(fd)  # closing drops the probe's own lock
        k += 1
    return held


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (waiting for it) for the ``with`` block."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
