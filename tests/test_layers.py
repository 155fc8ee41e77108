"""The house's floors (issue 27): the import graph of the package (every import, at module level or inside a
function) has no cycles and runs one way, down: client and service above the engine, the engine importing nothing
above it; the API and the client load no torch."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def import_graph() -> dict[str, set[str]]:
    paths = {}
    for path in ROOT.glob("lethe/**/*.py"):
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
            graph[name] |= {t for t in targets if t != name and (t in paths or not t.startswith("lethe"))}
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


# Each floor and the floors it may import. The engine's contract is its torch-free part; the service and the
# client reach the engine only through the torch-free modules listed below (tested to load no torch).
LAYERS = ("lethe.engine.contract", "lethe.engine", "lethe.service.api", "lethe.service.reports",
          "lethe.service.domain", "lethe.service.infra", "lethe.service.settings", "lethe.service", "lethe.worker",
          "lethe.client", "lethe.embedded", "lethe.demo", "lethe")
SERVICE = {"lethe.service.api", "lethe.service.reports", "lethe.service.domain", "lethe.service.infra",
           "lethe.service.settings"}
ALLOWED = {
    "lethe.engine.contract": set(),
    "lethe.engine": {"lethe.engine.contract"},
    "lethe.service.settings": set(),
    "lethe.service": set(),
    "lethe.service.infra": {"lethe.service.settings"},
    "lethe.service.domain": {"lethe.service.infra", "lethe.service.settings", "lethe.engine.contract",
                             "lethe.engine"},
    "lethe.service.reports": {"lethe.service.domain", "lethe.service.infra", "lethe.engine.contract",
                              "lethe.engine"},  # reads results by metric shape
    "lethe.service.api": SERVICE - {"lethe.service.api"} | {"lethe.engine.contract", "lethe.engine"},
    "lethe.worker": SERVICE - {"lethe.service.api"} | {"lethe.engine.contract", "lethe.engine"},
    "lethe.client": {"lethe.engine.contract"},  # reads and checks record files before sending them
    "lethe.embedded": set(LAYERS) - {"lethe.demo"},  # the launchers compose everything
    "lethe.demo": {"lethe.engine.contract", "lethe.engine", "lethe"},
    "lethe": set(),
}
# The engine modules the service may import besides the contract: torch-free by construction (checked below).
TORCH_FREE_ENGINE = {"lethe.engine.job_spec", "lethe.engine.methods",
                     "lethe.engine.methods.baseline_params", "lethe.engine.methods.masc",
                     "lethe.engine.methods.masc.params", "lethe.engine.audit", "lethe.engine.audit.metrics",
                     "lethe.engine.audit.verdict", "lethe.engine.connectivity", "lethe.engine.connectivity.params",
                     "lethe.engine.model", "lethe.engine.model.lora_targets", "lethe.engine.training",
                     "lethe.engine.training.result"}


def layer(module: str) -> str | None:
    return next((p for p in LAYERS if module == p or module.startswith(p + ".")), None)


def test_imports_flow_down_the_layers():
    wrong = {(m, t) for m, targets in import_graph().items() for t in targets
             if layer(t) and layer(m) != layer(t) and layer(t) not in ALLOWED[layer(m) or ""]}
    assert wrong == set()
    assert layer("lethe.service.api.jobs") == "lethe.service.api"
    assert "lethe.service.api" not in ALLOWED["lethe.worker"]


def test_the_engine_imports_nothing_above_it():
    above = ("lethe.service", "lethe.worker", "lethe.client", "lethe.embedded", "lethe.demo")
    frameworks = ("fastapi", "starlette", "celery", "kombu", "sqlalchemy", "alembic", "httpx")
    leaks = {(m, t) for m, targets in import_graph().items() if m.startswith("lethe.engine")
             for t in targets if t.startswith(above) or t.split(".")[0] in frameworks}
    assert leaks == set()


def test_the_service_reaches_the_engine_only_through_torch_free_modules():
    graph = import_graph()
    engine = {t for m, targets in graph.items() if m.startswith(("lethe.service", "lethe.client"))
              for t in targets if t.startswith("lethe.engine") and t in graph}
    assert engine - TORCH_FREE_ENGINE == {t for t in engine if t.startswith("lethe.engine.contract")}
    loaded = loaded_by(*sorted(TORCH_FREE_ENGINE | {t for t in graph if t.startswith("lethe.engine.contract")}))
    assert not loaded & {"torch", "transformers", "peft"}, loaded


def loaded_by(*modules: str) -> set[str]:
    """The top-level packages a fresh interpreter has loaded after importing `modules`."""
    code = f"import sys; import {', '.join(modules)}; print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    return set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              cwd=ROOT).stdout.split())


def test_the_worker_loads_no_web_framework_and_the_api_no_torch():
    """The worker raises the domain's errors, not HTTP ones; the API checks requests with the engine's torch-free
    contract (registry, parameters, record checks)."""
    worker = loaded_by("lethe.worker.runner", "lethe.worker.celery_app")
    assert not worker & {"fastapi", "starlette"}, worker & {"fastapi", "starlette"}
    api = loaded_by("lethe.service.api.app")
    assert not api & {"torch", "transformers", "peft"}, api & {"torch", "transformers", "peft"}


@pytest.mark.slow
def test_the_client_installs_and_runs_without_torch(tmp_path):
    """`pip install lethe[client]` into an empty venv: the client, its CLI and the webhook verifier import, the
    `lethe` command answers, and neither torch nor the service's frameworks are installed or loaded."""
    import shutil

    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "lethe", source / "lethe", ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", f"{source}[client]"], check=True, timeout=600,
                   cwd=tmp_path)
    code = ("import importlib.util, sys; import lethe.client, lethe.client.cli, lethe.client.webhooks; "
            "print(sorted(n for n in ('torch', 'transformers', 'fastapi', 'sqlalchemy', 'celery') "
            "if importlib.util.find_spec(n) or n in sys.modules))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip() == "[]"
    help_text = subprocess.run([str(venv / "bin" / "lethe"), "--help"], capture_output=True, text=True, check=True,
                               cwd=tmp_path).stdout
    assert "erase" in help_text and "models" in help_text, help_text


def defined_names(path: Path) -> tuple[set[str], set[str]]:
    """A module's own top-level names (defs, classes, assignments) and the names it merely imports."""
    own, imported = set(), set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Assign):
            own |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return own, imported


def test_no_name_is_imported_through_a_re_export():
    """`from lethe.x import name` takes the name from the module that defines it (or names a submodule): no module
    passes on another's names."""
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for p in ROOT.glob("lethe/**/*.py")}
    through = []
    for path in [*ROOT.glob("lethe/**/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("bench/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module in modules and node.level == 0):
                continue
            own, imported = defined_names(modules[node.module])
            for alias in node.names:
                if f"{node.module}.{alias.name}" in modules or alias.name in own:
                    continue
                if alias.name in imported:
                    through.append(f"{path.relative_to(ROOT)}: {alias.name} from {node.module}")
    assert through == []


def test_the_re_export_finder_finds_one(tmp_path):
    shim = tmp_path / "shim.py"
    shim.write_text("from a import b  # noqa: F401\nc = 1\ndef d(): pass\n")
    assert defined_names(shim) == ({"c", "d"}, {"b"})
