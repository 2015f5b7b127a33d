"""``python tests/cli_server.py MODULE``: runs ``python -m MODULE ARGS`` many times for one
interpreter start and one import of MODULE (support.CliServer starts it and talks to it).
``python tests/cli_server.py SCRIPT.py``: the same for ``python SCRIPT.py ARGS`` (the script's
folder first on ``sys.path`` instead of ``cwd``, the script not imported: it runs as ``__main__`` in
full), the server importing what :data:`PRELOAD` lists for the script's file name.

It imports MODULE (and with it what ``python -m MODULE`` imports: torch, Hydra, ...) and the
modules of :data:`PRELOAD` that MODULE imports as it runs, then reads
one JSON request a line from stdin: ``{"args", "cwd", "stdout", "stderr"}``. For each it forks a
child that is the process ``python -m MODULE ARGS`` would be once its imports are done: its working
directory ``cwd`` (first on ``sys.path``, as ``-m`` puts it), stdin from /dev/null, stdout and
stderr into the given files, then MODULE run as ``__main__`` (runpy, as ``-m`` does, the module
itself not yet imported: its ``__main__`` block, signal handlers included, runs in full), ending as
the interpreter ends a program (threads joined, atexit, stdio flushed: foxdqn.cli.fast_exit.exit_now,
without the teardown that follows). It writes the child's pid (``{"pid": N}``), waits for the child
and writes its exit status (``{"status": S}``; ``-N``: killed by signal N, as subprocess gives it),
each as one JSON line. Environment variables are the
server's own, but for the request's ``"env"`` (optional: names and values set in the child before
MODULE runs; for variables the command reads as it runs, never ones read at import): a call with
other ones needs a process of its own. Linux (fork).
"""
import importlib
import json
import os
import runpy
import sys
import traceback

from foxdqn.cli.fast_exit import exit_now  # what the interpreter does at exit, without its teardown

#: modules that a command imports inside its functions as it runs (a run's training, evaluation and report:
#: about 0.9 s a train call, 2-3 s an evaluate call on 2 busy cores; tensorboard's writer and the gate
#: another 0.15 s a smoke run on 2 idle cores), imported by the server after MODULE
#: so that each call finds them in memory; what the call runs is the same code. Not for a module whose
#: import starts threads (a fork copies none of them) or changes process-wide state.
PRELOAD = {
    "foxdqn.train": ("foxdqn.population.train", "foxdqn.logger", "foxdqn.replay.buffer", "foxdqn.step.build",
                     "foxdqn.run.resume", "foxdqn.population.evaluate", "foxdqn.population.ensemble",
                     "foxdqn.report.seeds", "foxdqn.report.walk_forward", "foxdqn.analysis.equity_plot",
                     "hydra_plugins.foxdqn_population.population_launcher", "matplotlib.figure",
                     "matplotlib.backends.backend_agg", "torch.fx.experimental.symbolic_shapes",
                     "torch.utils.tensorboard", "foxdqn.analysis.gate", "foxdqn.data.augment", "foxdqn.job.member",
                     "foxdqn.config.yaml_text", "hydra_plugins.foxdqn_population.sweeper"),
    "foxdqn.evaluate": ("torch", "pandas", "foxdqn.config.schema", "foxdqn.run.checkpoint", "foxdqn.data",
                        "foxdqn.analysis.backtest", "foxdqn.io_atomic", "foxdqn.step.build", "foxdqn.run.folder",
                        "foxdqn.execution.orders", "foxdqn.analysis.results_table", "foxdqn.analysis.equity_plot",
                        "matplotlib.figure", "matplotlib.backends.backend_agg",
                        "torch.fx.experimental.symbolic_shapes"),
}
#: tests/population/fake_trainer_run.py: python -m foxdqn.train with a fake population trainer
PRELOAD["fake_trainer_run.py"] = ("foxdqn.train", *PRELOAD["foxdqn.train"])


def _child(module: str, request: dict, protocol):
    protocol.close()
    os.chdir(request["cwd"])
    os.environ.update(request.get("env") or {})
    script = module.endswith(".py")
    sys.path[0] = os.path.dirname(os.path.abspath(module)) if script else os.getcwd()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    sys.argv = [module if script else "-m", *request["args"]]  # runpy puts the module's file in argv[0]
    if not script:
        sys.modules.pop(module)  # as under -m: MODULE runs as __main__ first, its imports are in memory
    try:
        if script:
            runpy.run_path(module, run_name="__main__")
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        exit_now(exc.code)
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        traceback.print_exc()
        exit_now(1)
    exit_now(0)


def main() -> None:
    module = sys.argv[1]
    protocol = os.fdopen(os.dup(1), "w")  # the replies; what the import prints goes to stderr
    os.dup2(2, 1)
    if not module.endswith(".py"):
        importlib.import_module(module)
    for name in PRELOAD.get(os.path.basename(module) if module.endswith(".py") else module, ()):
        importlib.import_module(name)
    for line in iter(sys.stdin.readline, ""):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                _child(module, json.loads(line), protocol)
            finally:
                os._exit(1)  # never back into the server's loop
        protocol.write(json.dumps({"pid": pid}) + "\n")  # for a signal to the child while it runs
        protocol.flush()
        _, wait_status = os.waitpid(pid, 0)
        protocol.write(json.dumps({"status": os.waitstatus_to_exitcode(wait_status)}) + "\n")
        protocol.flush()
    os._exit(0)  # without the interpreter's teardown (Triton's nanobind prints its leak lines there)


if __name__ == "__main__":
    main()
