"""No two npumem modules import each other, at any level (module top, inside functions, or for
type checking): each pair of concepts has one direction of dependence."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "src" / "npumem"


def _imports() -> dict[str, set[str]]:
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        package = name if is_package else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                found.add(target)
                found.update(f"{target}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        modules[name] = {target for target in found if target.startswith("npumem")}
    return modules


def test_no_two_modules_import_each_other():
    modules = _imports()
    assert "npumem.profile.tracker" in modules and "npumem.ops.tensor" in modules
    pairs = sorted({tuple(sorted((a, b))) for a, targets in modules.items() for b in targets
                    if b in modules and a in modules[b] and not a.startswith(b + ".")
                    and not b.startswith(a + ".") and a != b})
    assert pairs == [], f"modules that import each other: {pairs}"
