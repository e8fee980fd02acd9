"""The package's import graph, drawn from the source with ast (nothing is imported, so no torch): no circles, no
import from a lower layer to a higher one, and no more imports inside functions than today.

Run it as a script to print the graph's counts and what breaks a rule: python tests/test_layout.py [ROOT]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__" and len(sys.argv) > 1:
    ROOT = Path(sys.argv[1]).resolve()
PACKAGE = "trtspec"

# Layers, bottom to top, by module or package prefix (the longest prefix decides); a module imports from its own
# layer or below. Unlisted modules are the core (0): the contract, the config, the loop and its parts.
LAYERS = {
    # 1: what both a build and a served deployment use: the repository writer and reader, the engines
    "trtspec.repository": 1, "trtspec.repository_reader": 1, "trtspec.llmapi": 1, "trtspec.reference_engine": 1,
    "trtspec.reference_engine.batching": 1, "trtspec.reference_engine.ragged": 1,
    # 2: building, serving, the Triton models, the machine
    "trtspec.pipeline": 2, "trtspec.server": 2, "trtspec.triton": 2, "trtspec.machine": 2,
    # 3: the user's tools on top of a deployment
    "trtspec.bench": 3, "trtspec.openai": 3, "trtspec.k8s": 3, "trtspec.profiling": 3,
    # 4, 5: the CLI
    "trtspec.commands": 4, "trtspec.cli": 5,
}
# Imports inside functions: each delays a heavy import (torch, transformers) or an optional one; none breaks a
# circle. A ceiling, so that the count only goes down.
MAX_IMPORTS_IN_FUNCTIONS = 88


def modules() -> dict[str, Path]:
    out = {}
    for p in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if "model_repository" in parts:  # Triton model templates, not modules of the package
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(module: str, path: Path, known: dict[str, Path]) -> list[tuple[list[str], bool]]:
    """Per import statement of the package's modules: (the modules it runs, whether it is inside a function). An
    import of a.b.c also runs a/__init__ and a/b/__init__ (not counted for the importer's own packages)."""
    is_package = path.name == "__init__.py"

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    found: list[tuple[list[str], bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue  # never runs
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = module if is_package else module.rpartition(".")[0]
                    for _ in range(child.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}" if base else pkg
                targets = [f"{base}.{a.name}" for a in child.names]
            else:
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
                continue
            runs: list[str] = []
            for t in targets:
                if t == PACKAGE or t.startswith(PACKAGE + "."):
                    target = resolve(t)
                    while target and target != module and not module.startswith(target + "."):
                        if target in known:  # a folder without __init__ runs nothing
                            runs.append(target)
                        target = target.rpartition(".")[0]
            if runs:
                found.append((runs, in_function))

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], bool], int]:
    """(module -> what it imports, (a, b) -> whether every import of b by a is inside a function, the number of
    import statements of the package's modules inside functions)."""
    known = modules()
    edges: dict[str, set[str]] = {m: set() for m in known}
    only_in_functions: dict[tuple[str, str], bool] = {}
    in_functions = 0
    for m, p in known.items():
        for targets, in_function in imports(m, p, known):
            in_functions += in_function
            for target in targets:
                edges[m].add(target)
                only_in_functions[m, target] = only_in_functions.get((m, target), True) and in_function
    return edges, only_in_functions, in_functions


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def layer(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len, default=None)
    return 0 if best is None else LAYERS[best]


def upward(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} ({layer(a)}) -> {b} ({layer(b)})" for a, bs in edges.items() for b in bs
                  if layer(b) > layer(a))


def test_the_import_graph_has_no_circle():
    edges, only_in_functions, _ = graph()
    found = circles(edges)
    assert not found, "import circles:\n" + "\n".join(
        " <-> ".join(c) + ": " + ", ".join(f"{a} -> {b}{' (in a function)' if only_in_functions[a, b] else ''}"
                                           for a in c for b in sorted(edges[a]) if b in c)
        for c in found)


def test_no_module_imports_from_a_layer_above_its_own():
    edges, _, _ = graph()
    assert not upward(edges), "upward imports (see LAYERS):\n" + "\n".join(upward(edges))


def test_imports_inside_functions_do_not_grow():
    _, _, n = graph()
    assert n <= MAX_IMPORTS_IN_FUNCTIONS, (
        f"{n} imports of trtspec inside functions, more than {MAX_IMPORTS_IN_FUNCTIONS}: import at the top of the "
        "module, unless the import is heavy (torch) or optional")


def test_the_checks_find_what_they_look_for():
    """Each check fails on the layout it forbids: a circle, an upward import."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert upward({"trtspec.repository": {"trtspec.server.launch"}}) == [
        "trtspec.repository (1) -> trtspec.server.launch (2)"]
    assert upward({"trtspec.server.launch": {"trtspec.repository"}}) == []


if __name__ == "__main__":
    edges, only_in_functions, n = graph()
    print(f"{len(edges)} modules, {sum(map(len, edges.values()))} imports between them, "
          f"{sum(only_in_functions.values())} of them only inside functions; {n} import statements of trtspec "
          f"inside functions")
    for c in circles(edges):
        print("circle:", " <-> ".join(c))
    for u in upward(edges):
        print("upward:", u)
    sys.exit(1 if circles(edges) or upward(edges) else 0)
