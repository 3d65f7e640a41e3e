"""The package's layers (docs/architecture.md): imports run one way, and no module imports itself back.

spec (what the user describes) <- plan (costs, memory, schedules; no simpy) <- engine (simpy) <- decide
(sweeps, search, compare, validate) <- cli; report (results, timelines, charts) reads spec only, and engine,
decide and cli read report. Every ``import`` counts, the lazy ones inside functions too."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "simtrain"

#: layer -> the layers its modules may import (itself included)
ALLOWED = {
    "spec": {"spec"},
    "plan": {"plan", "spec"},
    "report": {"report", "spec"},
    "engine": {"engine", "plan", "report", "spec"},
    "decide": {"decide", "engine", "plan", "report", "spec"},
    "cli": {"cli", "decide", "engine", "plan", "report", "spec"},
}
#: the top-level facade (simtrain/__init__.py) may import any layer; data packages hold no code
DATA_PACKAGES = {"presets", "validation", "hardware_data", "scenario_data"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every simtrain module ``path`` imports (``from simtrain.x import y`` names simtrain.x.y when that is a
    module)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("simtrain")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("simtrain"):
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    found.add(sub if sub in MODULES else target)
    found.discard(me)
    return found


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_module_sits_in_a_layer():
    """Code lives in a layer subpackage; the package root holds only the facade (__init__)."""
    loose = [m for m in MODULES if layer_of(m) not in ALLOWED and m != "simtrain"
             and layer_of(m) not in DATA_PACKAGES]
    assert loose == []


def test_imports_run_down_the_layers():
    """No layer imports a layer above it (nor the facade `simtrain` itself, which imports them all)."""
    wrong = []
    for module, path in MODULES.items():
        layer = layer_of(module)
        if layer not in ALLOWED:
            continue
        for target in imports_of(path):
            if target == "simtrain" or layer_of(target) not in ALLOWED[layer]:
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_no_import_cycle():
    """The module graph is acyclic (depth-first search for a back edge)."""
    graph = {m: {t for t in imports_of(p) if t in MODULES} for m, p in MODULES.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_checks_see_a_violation(tmp_path):
    """The walker itself finds a lazy upward import (so the layer test can fail)."""
    fake = PACKAGE / "spec" / "errors.py"
    tree_imports = imports_of(fake)
    assert all(layer_of(t) == "spec" for t in tree_imports)
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from simtrain.engine.simulation import simulate\n")
    found = {n.module for n in ast.walk(ast.parse(probe.read_text())) if isinstance(n, ast.ImportFrom)}
    assert found == {"simtrain.engine.simulation"}
