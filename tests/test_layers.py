"""The package's import graph: no cycles (deferred imports included), no module importing a layer
above its own, the caller side never loading llama.cpp or torch, the dialects and jobs never a web
framework, and the transport's functions short.

Read from the source with ``ast``: every ``import`` statement counts, at module level or inside a
function, under ``TYPE_CHECKING`` or not.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {"llamactor": ROOT / "actors", "llamactor.native": ROOT / "native"}

# Lower layers first; a module may import its own layer and the ones before it. `llamactor`
# itself (__init__) and `start()` (`llamactor.launch`) sit above the caller side and the router. The dialects (pure translation) sit
# below both of their users: batch jobs and the HTTP transport.
LAYERS = [
    ("base", ["llamactor.base"]),
    ("scheduling", ["llamactor.scheduling"]),
    ("native", ["llamactor.native"]),
    ("actor tree", ["llamactor.tree"]),
    ("handles", ["llamactor.handles"]),
    ("serving", ["llamactor.serving"]),
    ("start", ["llamactor.launch", "llamactor"]),
    ("dialects", ["llamactor.dialects"]),
    ("jobs", ["llamactor.jobs"]),
    ("http", ["llamactor.http"]),
    ("front ends", ["llamactor.rayserve", "llamactor.cli", "llamactor.bench"]),
]
WEB_FRAMEWORKS = {"fastapi", "starlette", "uvicorn"}
LONGEST_HTTP_FUNCTION = 80  # lines: a handler that grows past this is doing a dialect's or the path's job


def module_files() -> dict[str, Path]:
    files = {}
    for package, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join([package, *parts])] = path
    return files


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The llamactor modules ``name`` imports, wherever the import statement stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            # `from llamactor.x import y`: y may itself be a module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}


def layer_of(module: str) -> int:
    """A module's layer, by the longest prefix of the layer list it starts with."""
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or (p.count(".") and module.startswith(p + ".")) for p in prefixes):
            return i
    raise AssertionError(f"{module} is in no layer")


def test_the_import_graph_has_no_cycle_even_counting_deferred_imports() -> None:
    edges = graph()
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module)


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = [f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
              for a, targets in graph().items() for b in targets
              if layer_of(b) > layer_of(a) and not b.startswith(a + ".")]  # a package may import its own modules
    assert not upward, "\n".join(upward)


def imported_roots(path: Path) -> set[str]:
    """The top-level packages a module imports (absolute imports, anywhere in it)."""
    tree = ast.parse(path.read_text())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return roots | {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}


def test_only_native_and_the_benchmark_yardsticks_import_llama_cpp_or_torch() -> None:
    offenders = [name for name, path in module_files().items()
                 if imported_roots(path) & {"llama_cpp", "torch"} and not name.startswith("llamactor.native")
                 and name != "llamactor.bench.baselines"]
    assert not offenders


def test_the_pure_layers_import_no_actor_framework() -> None:
    """base and scheduling are values and functions over them: what needs pykka sits in the tree."""
    offenders = [name for name, path in module_files().items()
                 if name.startswith(("llamactor.base", "llamactor.scheduling")) and "pykka" in imported_roots(path)]
    assert not offenders


def test_the_dialects_and_the_jobs_import_no_web_framework() -> None:
    offenders = {name: sorted(imported_roots(path) & WEB_FRAMEWORKS) for name, path in module_files().items()
                 if name.startswith(("llamactor.dialects", "llamactor.jobs")) and imported_roots(path) & WEB_FRAMEWORKS}
    assert not offenders


def test_running_a_batch_job_loads_no_web_framework() -> None:
    code = "import sys, llamactor.jobs, llamactor.cli.batch; print('fastapi' in sys.modules, 'starlette' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr


def test_no_function_of_the_http_transport_runs_over_eighty_lines() -> None:
    long = [f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines"  # type: ignore[operator]
            for name, path in module_files().items() if name.startswith("llamactor.http")
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > LONGEST_HTTP_FUNCTION]  # type: ignore[operator]
    assert not long


def test_importing_the_library_and_the_http_app_loads_neither_torch_nor_llama_cpp() -> None:
    code = ("import sys, llamactor, llamactor.http.server, llamactor.handles.model; "
            "print('torch' in sys.modules, 'llama_cpp' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr


def test_the_architecture_doc_has_one_row_per_module_and_no_other() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    table = doc[doc.index("## One line per module"):]
    rows = set(re.findall(r"^\| `((?:actors|native)/[^`]+\.py)`", table, re.M))
    files = {str(path.relative_to(ROOT)) for folder in SOURCES.values() for path in folder.rglob("*.py")
             if path.name not in ("__init__.py", "__main__.py")} | {"actors/__init__.py"}
    assert not files - rows, f"modules missing from docs/architecture.md: {sorted(files - rows)}"
    assert not rows - files, f"rows naming no module: {sorted(rows - files)}"
