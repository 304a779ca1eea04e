"""The core reads like the course: small files, small classes, a short step loop, imports one way.

The notebooks print the engine's source; these limits keep what they print readable. The core is
nano_infer/ without bench/, viz/ and exercises/ (tools around the engine, not the engine).
"""
import ast
from pathlib import Path

import nano_infer

PACKAGE = Path(nano_infer.__file__).parent
CORE = [p for p in PACKAGE.rglob("*.py") if not {"bench", "viz", "exercises"} & set(p.relative_to(PACKAGE).parts)]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """Modules of the package that `path` imports, at the top or inside a function."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found |= {t for t in [target] + [f"{target}.{a.name}" for a in node.names] if t in modules}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
    return found - {name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
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

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_core_file_over_300_lines_and_no_class_over_250():
    long_files = {str(p.relative_to(PACKAGE)): n for p in CORE if (n := len(p.read_text().splitlines())) > 300}
    classes = {f"{p.relative_to(PACKAGE)}:{c.name}": c.end_lineno - c.lineno + 1
               for p in CORE for c in ast.walk(ast.parse(p.read_text()))
               if isinstance(c, ast.ClassDef) and c.end_lineno - c.lineno + 1 > 250}
    assert not long_files and not classes, (long_files, classes)


def test_the_step_loop_every_chapter_prints_is_at_most_30_lines():
    tree = ast.parse((PACKAGE / "engine" / "llm_engine.py").read_text())
    (step,) = [f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "LLMEngine"
               for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "step"]
    assert step.end_lineno - step.lineno + 1 <= 30


def test_no_import_cycle_in_the_package():
    paths = list(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph = {module_name(p): imports(p, modules) for p in paths}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
