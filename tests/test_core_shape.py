"""The core reads like the course: small files, small classes, a short step loop, imports one way.

The notebooks print the engine's source; these limits keep what they print readable. The core is
nano_infer/ without bench/, viz/ and exercises/ (tools around the engine, not the engine).
"""
import ast
import dataclasses
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
    assert {"core", "engine", "models", "kv", "prefix", "async_engine", "api_server", "text", "cli"} <= {
        p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}


def test_tests_are_grouped_like_the_package():
    """A module's tests are found from its path: tests/<part>/test_<module>.py, few files left at the top."""
    tests = Path(__file__).parent
    folders = [p for p in tests.iterdir() if p.is_dir() and (PACKAGE / p.name).is_dir()]
    assert len(folders) >= 3 and len(list(tests.glob("test_*.py"))) <= 12
    assert (tests / "engine" / "test_scheduler.py").exists() and (tests / "kv" / "test_block_manager.py").exists()


# -- layers: every import runs down --------------------------------------------------------------
# The package's parts from the bottom up. A module may import its own part or one below it, never one above.
LAYERS = [
    {"outputs", "sampling_params", "inputs", "constrained", "text", "config", "compilation"},  # records and pure algorithms
    {"core"},  # the shared records: Sequence, Request, the step's batch, the plug-in base, the published stats
    {"prefix"},
    {"kv"},
    {"models"},
    {"distributed"},  # starts worker processes and moves messages; the engine names the runner they build
    {"engine"},
    {"beam", "spec"},  # features: register with the engine, never named by it
    {"llm"},
    {"async_engine"},  # the engine on a thread of its own: admission, tenants, streams, metrics
    {"api_server"},  # the OpenAI-compatible HTTP app
    {"cli", "__main__", "nano_infer", "bench", "viz", "exercises"},  # tools and entry points
]
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


def part_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "nano_infer"


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from a module to one in a higher layer (a part missing from LAYERS is an error of its own)."""
    return sorted((a, b) for a, targets in graph.items() for b in targets if RANK[part_of(b)] > RANK[part_of(a)])


def package_graph() -> dict[str, set[str]]:
    paths = list(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports(p, modules) for p in paths}


def test_every_part_has_a_layer_and_every_import_runs_down():
    graph = package_graph()
    assert {part_of(m) for m in graph} <= set(RANK), {part_of(m) for m in graph} - set(RANK)
    assert upward_imports(graph) == []


def test_kv_and_prefix_know_no_engine_the_engine_names_no_feature_and_config_loads_no_engine_module():
    graph = package_graph()
    edges = {(part_of(a), part_of(b)) for a, targets in graph.items() for b in targets}
    assert not {("kv", "engine"), ("prefix", "engine"), ("engine", "beam"), ("engine", "spec")} & edges
    assert {part_of(b) for b in graph["nano_infer.config"]} <= LAYERS[0]


def test_the_layer_check_finds_a_planted_upward_import():
    planted = {"nano_infer.kv.manager": {"nano_infer.engine.sequence", "nano_infer.core.sequence"},
               "nano_infer.engine.llm_engine": {"nano_infer.beam.plugin", "nano_infer.kv.manager"},
               "nano_infer.config": {"nano_infer.spec.config"}}
    assert upward_imports(planted) == [("nano_infer.config", "nano_infer.spec.config"),
                                       ("nano_infer.engine.llm_engine", "nano_infer.beam.plugin"),
                                       ("nano_infer.kv.manager", "nano_infer.engine.sequence")]


# -- the shared records stay small, and every boundary names its types --------------------------------
MAX_SEQUENCE_FIELDS = 12


def too_many_fields(cls) -> bool:
    return len(dataclasses.fields(cls)) > MAX_SEQUENCE_FIELDS


def test_sequence_holds_what_every_step_needs_and_no_feature_s_state():
    from nano_infer.core.sequence import Sequence

    assert not too_many_fields(Sequence), [f.name for f in dataclasses.fields(Sequence)]
    assert not {"prefix_handle", "block_hashes", "beam", "spec_token_ids"} & {f.name for f in dataclasses.fields(Sequence)}


def test_the_field_count_check_refuses_a_planted_thirteenth_field():
    planted = dataclasses.make_dataclass("Planted", [f"f{i}" for i in range(MAX_SEQUENCE_FIELDS + 1)])
    assert too_many_fields(planted) and not too_many_fields(dataclasses.make_dataclass("Fine", ["a", "b"]))


def object_annotations(source: str) -> list[int]:
    """Lines that annotate an attribute, an argument or a return as `object` (alone or in a union)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        annotations = [node.annotation] if isinstance(node, (ast.AnnAssign, ast.arg)) else []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            annotations.append(node.returns)
        for annotation in annotations:
            if annotation is not None and any(isinstance(n, ast.Name) and n.id == "object" for n in ast.walk(annotation)):
                found.append(annotation.lineno)
    return found


def test_no_boundary_is_annotated_object():
    found = {str(p.relative_to(PACKAGE)): lines for p in CORE if (lines := object_annotations(p.read_text()))}
    assert found == {}


def test_the_annotation_check_finds_a_planted_object():
    assert object_annotations("class A:\n    x: object = None\n    y: int | object\n") == [2, 3]
    assert object_annotations("def f(a: object, b: int) -> object: ...\n") == [1, 1]
    assert object_annotations("def f(a: int) -> str:\n    x: list[int] = []\n") == []


# -- one writer of the engine's request table ------------------------------------------------------------
def request_table_writes(source: str) -> list[int]:
    """Lines that add to, remove from or make a `.requests` table (a read, or keeping a reference to the
    engine's table, is not a write)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if isinstance(target, ast.Subscript):
                    target = target.value
                elif isinstance(getattr(node, "value", None), ast.Name):
                    continue  # `self.requests = requests`: a reference, not a new table
                if isinstance(target, ast.Attribute) and target.attr == "requests":
                    found.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in {"pop", "popitem", "clear", "update", "setdefault"}
              and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "requests"):
            found.append(node.lineno)
    return sorted(found)


def test_the_engine_is_the_one_writer_of_its_request_table():
    writers = {str(p.relative_to(PACKAGE)) for p in CORE if request_table_writes(p.read_text())}
    assert writers == {"engine/llm_engine.py"}


def test_the_writer_check_finds_planted_writes_and_passes_reads():
    planted = "self.requests[r] = x\ndel self.requests[r]\nself.requests.pop(r)\nself.requests = {}\n"
    assert request_table_writes(planted) == [1, 2, 3, 4]
    assert request_table_writes("req = self.requests[r]\nok = r in self.requests\nn = len(self.requests)\n") == []


# -- one construction path -----------------------------------------------------------------------------------
def names_bound_twice(source: str, function: str) -> set[str]:
    """Local names `function` binds more than once (assignment, walrus, loop or with target)."""
    (func,) = [f for f in ast.walk(ast.parse(source)) if isinstance(f, ast.FunctionDef) and f.name == function]
    seen, twice = set(), set()
    for node in ast.walk(func):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr, ast.For)):
            targets = [node.target]
        for target in targets:
            for name in (n.id for n in ast.walk(target) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)):
                (twice if name in seen else seen).add(name)
    return twice


def test_build_engine_binds_each_part_once_and_returns_them_frozen():
    """The order is the function's: a part is made once, from parts made before it, and never replaced."""
    from nano_infer.engine.build import EngineParts

    assert names_bound_twice((PACKAGE / "engine" / "build.py").read_text(), "build_engine") == set()
    assert EngineParts.__dataclass_params__.frozen


def test_the_rebinding_check_finds_a_planted_second_assignment():
    planted = "def build_engine(c):\n    device = 1\n    model = load(device)\n    device = 2\n    return model\n"
    assert names_bound_twice(planted, "build_engine") == {"device"}
    assert names_bound_twice("def build_engine(c):\n    a = 1\n    b = a\n", "build_engine") == set()
