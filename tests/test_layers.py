"""The package's layers (docs/README.md#code-map): no import cycle, no import that runs upward
between rooms, at most 8 modules at foxdqn/'s root. Reads the sources with ast; imports nothing."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: foxdqn's rooms from the bottom layer up (docs/README.md#code-map). A module may import from its own
#: room and from rooms of a lower rank; equal ranks do not import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "io_atomic", "io_pool", "timings"),
    ("__init__",),  # foxdqn/__init__.py starts the start-up clock (timings)
    ("device", "execution", "data"),
    ("ops",),
    ("nn", "replay"),
    ("envs",),  # the trading env's collect hook writes into the replay (envs/trading_hook.py)
    ("actions",),
    ("config",),
    ("objectives", "logger"),
    ("step",),
    ("analysis",),
    ("run",),
    ("report",),
    ("population",),
    ("job",),  # a single run trains as a population of one (foxdqn.job.run.run_job)
    ("cli",),
    ("hydra_plugins",),  # hydra_plugins/foxdqn_population: the launcher and sweeper that foxdqn.train registers
    ("train", "evaluate"),
)
RANK = {room: rank for rank, rooms in enumerate(LAYERS) for room in rooms}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    files = [p for top in ("foxdqn", "hydra_plugins") for p in (ROOT / top).rglob("*.py")]
    mods = {_module(p): p for p in files}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                raise AssertionError(f"{path}: relative import (use foxdqn.<room>.<module>)")
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                     if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                if name and name != m and not m.startswith(name + "."):
                    graph[m].add(name)
    return graph


def _room(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "hydra_plugins":
        return "hydra_plugins"
    return parts[1] if len(parts) > 1 else "__init__"


def _rank(module: str) -> int:
    return RANK[_room(module)]


def test_every_room_has_a_layer():
    rooms = {_room(m) for m in _graph() if m.startswith("foxdqn")}
    assert rooms <= set(RANK), f"rooms without a layer in tests/test_layers.py: {sorted(rooms - set(RANK))}"


def test_imports_only_point_down():
    graph = _graph()
    up = sorted(f"{m} -> {n}" for m, deps in graph.items() for n in deps
                if _room(m) != _room(n) and _rank(n) >= _rank(m))
    assert not up, "imports that run upward or sideways between rooms:\n" + "\n".join(up)


def test_no_import_cycle():
    graph, seen, done, cycles = _graph(), set(), set(), []

    def visit(m: str, stack: list[str]) -> None:
        seen.add(m)
        stack.append(m)
        for n in graph[m]:
            if n in stack:
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in seen:
                visit(n, stack)
        stack.pop()
        done.add(m)

    for m in sorted(graph):
        if m not in seen:
            visit(m, [])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_root_holds_at_most_8_modules():
    root = sorted(p.name for p in (ROOT / "foxdqn").glob("*.py") if p.name != "__init__.py")
    assert len(root) <= 8, f"foxdqn/ has {len(root)} modules at its root: {root}"

