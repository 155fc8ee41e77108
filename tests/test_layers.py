"""The import graph of service/ and worker/ (every import, at module level or inside a function): no
cycles, and the engine imports none of the service's frameworks (issue 13)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def import_graph() -> dict[str, set[str]]:
    paths = {}
    for path in [*ROOT.glob("service/**/*.py"), *ROOT.glob("worker/**/*.py")]:
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        paths[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t != name and (t in paths or not t.startswith(("service", "worker")))}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


# Each layer and the layers it may import (issue 13). The API reaches the engine only for its torch-free contract
# (the method registry, parameters, job specification, record checks); that it loads no torch is tested below.
LAYERS = ("service.api", "service.reports", "service.domain", "service.infra", "service.settings", "worker.engine",
          "worker", "lethe")
ALLOWED = {
    "service.infra": {"service.settings"},
    "service.domain": {"service.infra", "service.settings", "worker.engine"},
    "service.reports": {"service.domain", "service.infra", "worker.engine"},  # reads results by metric shape
    "service.api": {"service.domain", "service.infra", "service.reports", "service.settings", "worker.engine"},
    "worker": {"service.domain", "service.infra", "service.reports", "service.settings", "worker.engine"},
    "worker.engine": set(),
    "lethe": set(LAYERS),  # the launchers compose everything
}


def layer(module: str) -> str | None:
    return next((p for p in LAYERS if module == p or module.startswith(p + ".")), None)


def test_imports_flow_down_the_layers():
    wrong = {(m, t) for m, targets in import_graph().items() for t in targets
             if layer(t) and layer(m) != layer(t) and layer(t) not in ALLOWED[layer(m) or ""]}
    assert wrong == set()
    assert layer("service.api.jobs") == "service.api" and "service.api" not in ALLOWED["worker"]


def test_the_engine_imports_no_service_framework():
    graph = import_graph()
    frameworks = ("fastapi", "starlette", "celery", "kombu", "sqlalchemy", "alembic", "service")
    leaks = {(m, t) for m, targets in graph.items() if m.startswith("worker.engine")
             for t in targets if t.split(".")[0] in frameworks}
    assert leaks == set()


def loaded_by(*modules: str) -> set[str]:
    """The top-level packages a fresh interpreter has loaded after importing `modules`."""
    import subprocess
    import sys

    code = f"import sys; import {', '.join(modules)}; print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    return set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              cwd=ROOT).stdout.split())


def test_the_worker_loads_no_web_framework_and_the_api_no_torch():
    """The worker raises the domain's errors, not HTTP ones; the API checks requests with the engine's torch-free
    contract (registry, parameters, record checks)."""
    worker = loaded_by("worker.runner", "worker.celery_app")
    assert not worker & {"fastapi", "starlette"}, worker & {"fastapi", "starlette"}
    api = loaded_by("service.api.app")
    assert not api & {"torch", "transformers", "peft"}, api & {"torch", "transformers", "peft"}
