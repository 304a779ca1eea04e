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


def test_num_computed_tokens_is_written_in_at_most_two_core_files():
    """One owner for the field every stage reads: the KV manager sets the cached prefix at admission, the
    scheduler advances it after a step, resets it on preemption and copies it on a fork; plug-ins call them."""
    writers = set()
    for p in CORE:
        for node in ast.walk(ast.parse(p.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                for t in ast.walk(target):  # a, b.num_computed_tokens = ... too
                    if isinstance(t, ast.Attribute) and t.attr == "num_computed_tokens" and isinstance(t.ctx, ast.Store):
                        writers.add(str(p.relative_to(PACKAGE)))
    assert len(writers) <= 2, sorted(writers)


def test_no_import_cycle_in_the_package():
    paths = list(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph = {module_name(p): imports(p, modules) for p in paths}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_top_level_is_the_public_api_and_every_part_is_a_folder():
    """A newcomer sees LLM, SamplingParams, outputs and config first; the engine's parts are folders."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 8, top
    assert {"engine", "models", "kv", "prefix", "serving", "server", "text", "cli"} <= {
        p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}


def test_tests_are_grouped_like_the_package():
    """A module's tests are found from its path: tests/<part>/test_<module>.py, few files left at the top."""
    tests = Path(__file__).parent
    folders = [p for p in tests.iterdir() if p.is_dir() and (PACKAGE / p.name).is_dir()]
    assert len(folders) >= 3 and len(list(tests.glob("test_*.py"))) <= 12
    assert (tests / "engine" / "test_scheduler.py").exists() and (tests / "kv" / "test_block_manager.py").exists()
