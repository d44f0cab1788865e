"""The map of npumem's floors: every import runs down it, and no modules import one another in a
circle, at any level (module top, inside functions, or for type checking). A failure names the
import and the concept that must move (not the import) to make it run down again."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "src" / "npumem"

# Lowest first. A module may import its own floor's modules and those below; a package's
# modules are on the package's floor. docs/architecture.md draws the same map.
FLOORS = [
    ("ground", ["errors", "units", "constants", "observe", "progress", "events", "file_paths",
                "dtypes", "cli_sizes"]),
    ("models", ["aicore", "planning"]),
    ("device", ["device"]),
    ("runtime", ["runtime", "environment_check"]),
    ("alloc", ["alloc"]),
    ("trace", ["trace"]),
    ("whatif", ["whatif"]),
    ("profile", ["profile", "output_files"]),
    ("kernel", ["kernel"]),
    ("api", ["memory", "accelerator", "acl"]),
    ("ops", ["ops", "zero_copy", "precision", "mixed_precision", "pipeline", "kvcache", "bridges"]),
    ("tools", ["estimate", "demo", "view"]),
    ("entry", ["__init__", "profile_hook", "cli", "__main__"]),
]
FLOOR = {room: level for level, (_, rooms) in enumerate(FLOORS) for room in rooms}


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, dict[str, tuple[int, str]]]:
    """Each module's npumem imports: the module imported -> (line, the names it takes). `from
    package import name` imports the module package.name where there is one (C extensions
    count: their sources are the .c files)."""
    paths = {_module_name(path): path for path in ROOT.rglob("*.py")}
    extensions = {_module_name(path) for path in ROOT.rglob("*.c")}
    modules = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    module = f"{target}.{alias.name}"
                    if module in paths or module in extensions:
                        found.setdefault(module, (node.lineno, "the module"))
                    else:
                        line, names = found.get(target, (node.lineno, ""))
                        found[target] = (line, f"{names}, {alias.name}".lstrip(", "))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    found.setdefault(alias.name, (node.lineno, "the module"))
        modules[name] = {target: used for target, used in found.items()
                         if target in paths and target != name}
    return modules


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_module_has_a_floor():
    rooms = {_room(module) for module in _imports()}
    assert rooms - set(FLOOR) == set(), "put these on a floor of the map (FLOORS)"


def test_every_import_runs_down_the_map():
    climbs = []
    for module, targets in _imports().items():
        for target, (line, names) in targets.items():
            here, there = FLOOR[_room(module)], FLOOR[_room(target)]
            if there > here:
                climbs.append(f"{module} (floor {FLOORS[here][0]}) line {line} takes {names} "
                              f"from {target} (floor {FLOORS[there][0]}): move that concept "
                              f"down to floor {FLOORS[here][0]} or below, or {module} up")
    assert climbs == [], "imports that climb the map:\n" + "\n".join(climbs)


def test_no_circles():
    graph = _imports()
    circles = []
    index, low, stack, on_stack = {}, {}, [], set()

    def visit(node):                     # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    described = []
    for component in circles:
        edges = [f"  {a} line {graph[a][b][0]} takes {graph[a][b][1]} from {b}"
                 for a in component for b in graph[a] if b in component]
        described.append("modules that import one another in a circle (one of them holds a "
                         "concept the others need; move it below them all):\n" + "\n".join(edges))
    assert circles == [], "\n".join(described)


def test_the_map_sees_imports_inside_functions_and_of_submodules():
    modules = _imports()
    assert "npumem.trace.snapshot.columns" in modules["npumem.trace.snapshot.recording"]
    assert "npumem.whatif.torch_replay" in modules["npumem.whatif.torch_tune"]


def test_an_unbuilt_pool_says_what_to_do():
    """A checkout used before `pip install -e .`: the pool's C parts missing give one clear
    ImportError naming the fix, not "cannot import name '_free_list'"."""
    import subprocess
    import sys

    hide = (
        "import sys, importlib.abc\n"
        "class Hide(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'npumem.alloc._free_list':\n"
        "            raise ImportError('No module named ' + repr(name))\n"
        "sys.meta_path.insert(0, Hide())\n"
        "try:\n"
        "    import npumem.alloc.block\n"
        "except ImportError as error:\n"
        "    print(error)\n")
    out = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True,
                         timeout=120).stdout
    assert "needs its C extension _free_list" in out and "pip install -e ." in out
