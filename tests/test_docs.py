"""The docs tell the truth: every Python snippet in README.md and docs/ runs as written (in a
fresh interpreter), every file they name exists, and the architecture lists every command."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SNIPPET = re.compile(r"(<!-- needs: (\w+) -->\n)?```python\n(.*?)```", re.S)


def _snippets():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in SNIPPET.finditer(text):
            line = text[:match.start(3)].count("\n")
            yield pytest.param(match.group(3), match.group(2),
                               id=f"{page.relative_to(ROOT)}:{line}")


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.parametrize("code, needs", list(_snippets()))
def test_every_python_snippet_runs(code, needs, tmp_path):
    if needs == "cuda" and not _cuda():
        pytest.skip("this snippet needs a CUDA GPU")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "NPUMEM_SANITIZE": "0"})
    assert done.returncode == 0, f"the snippet failed:\n{code}\n{done.stderr[-2000:]}"


def test_every_file_the_docs_name_exists():
    missing = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for path in re.findall(r"((?:src/npumem|tests|bench|docs)/[\w/.\-]+\.(?:py|md|sh))", text):
            if not (ROOT / path).exists():
                missing.append(f"{page.name}: {path}")
        for path in re.findall(r"`((?:device|runtime|alloc|ops|profile|trace|planning|kvcache|"
                               r"bridges|acl|aicore|kernel)/\w+\.py)`", text):
            if not (ROOT / "src" / "npumem" / path).exists():
                missing.append(f"{page.name}: {path}")
    assert not missing, missing


def test_the_architecture_lists_every_command():
    from npumem.cli import main

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"\b(\w+)\b", text.split("```")[1].split("api")[0]))
    assert set(main.commands) <= listed, set(main.commands) - listed
