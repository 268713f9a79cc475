"""docs/architecture.md names only things that exist.

The architecture page is prose about the tree; this keeps it true as the tree
moves.  Every path it names (in backticks or as a relative link) must exist,
and every module-qualified name it cites (`kernel_model.sched.SCHED`) must
import and resolve.
"""

from __future__ import annotations

import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("kernel_model", "drivers", "peermem_clients", "userspace", "c_ext",
            "peermem_testing", "scenarios")

CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")
PATHLIKE = re.compile(r"^[\w./-]+$")


def _text() -> str:
    return DOC.read_text()


def _code_spans() -> list[str]:
    # Fenced blocks are diagrams, not references.
    text = re.sub(r"```.*?```", "", _text(), flags=re.S)
    return CODE.findall(text)


def _paths() -> list[str]:
    out = []
    for span in _code_spans():
        if not PATHLIKE.match(span) or span.startswith(("/", "-")):
            continue
        if "/" in span or re.search(r"\.(py|md|c|h|toml)$", span):
            if DOTTED.match(span) and not span.endswith((".py", ".md", ".c", ".h", ".toml")):
                continue  # a dotted name, not a file
            out.append(span)
    return sorted(set(out))


def _links() -> list[str]:
    return sorted({t for t in LINK.findall(_text()) if "://" not in t})


def _names() -> list[str]:
    return sorted({s for s in _code_spans()
                   if DOTTED.match(s) and s.split(".")[0] in PACKAGES
                   and not s.endswith((".py", ".md", ".c", ".h"))})


def _resolve_path(p: str) -> pathlib.Path | None:
    """A path is relative to the repository (or to docs/, as links are); a bare file
    name, where the text around it names the folder, must be a file of the tree."""
    for base in (ROOT, ROOT / "docs"):
        if (base / p).exists():
            return base / p
    if "/" not in p:
        for pkg in PACKAGES:
            hit = next((ROOT / pkg).rglob(p), None)
            if hit is not None:
                return hit
    return None


def test_the_doc_names_paths_and_names() -> None:
    assert len(_paths()) > 40 and len(_names()) > 10 and len(_links()) > 5


@pytest.mark.parametrize("path", _paths())
def test_every_path_exists(path: str) -> None:
    assert _resolve_path(path) is not None, f"docs/architecture.md names {path}, which is gone"


@pytest.mark.parametrize("link", _links())
def test_every_relative_link_resolves(link: str) -> None:
    assert (DOC.parent / link).exists(), f"docs/architecture.md links {link}, which is gone"


@pytest.mark.parametrize("name", _names())
def test_every_qualified_name_imports(name: str) -> None:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            assert hasattr(obj, attr), f"{name}: {'.'.join(parts[:i])} has no {attr}"
            obj = getattr(obj, attr)
        return
    pytest.fail(f"{name}: no module of it imports")


def test_readme_links_here_not_outside_the_repository() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "docs/architecture.md" in readme
    assert "../shared/" not in readme
