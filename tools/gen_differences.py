"""Generate docs/differences.md: every `EMU:` note in the product code, by subsystem.

A deliberate difference from the real kernel or library is marked `# EMU:` in a
comment, or `EMU:` in a docstring, with its reason (see ../README.md).  This
script collects them all so a reader can see in one page where the emulator is
not the kernel.  Each note is anchored by file path and the enclosing class or
function (never a line number, so the page does not change when code moves), and
its text is the whole note: a comment's continuation lines, a docstring note's
paragraph, a parenthesised note up to its closing parenthesis.

    python tools/gen_differences.py            # rewrite docs/differences.md
    python tools/gen_differences.py --check    # exit 1 if the file is stale

tests/docs/test_differences_doc.py regenerates the page in memory and compares.
Only the standard library is used.
"""

from __future__ import annotations

import argparse
import ast
import io
import pathlib
import re
import sys
import tokenize
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "differences.md"
PACKAGES = ("kernel_model", "drivers", "peermem_clients", "userspace", "c_ext",
            "peermem_testing", "scenarios")
REGENERATE = "python tools/gen_differences.py"

# Folder -> what it is, for the section headings; other folders get their path.
TITLES = {
    "kernel_model": "the kernel's primitives and the emulator's machinery",
    "kernel_model/hw": "the emulated hardware (ConnectX, GPUs, fabric)",
    "kernel_model/uapi": "uapi headers",
    "drivers": "small drivers",
    "drivers/ib_core": "ib_core (drivers/infiniband/core, MLNX_OFED peer_mem)",
    "drivers/mlx5_core": "mlx5_core",
    "drivers/mlx5_ib": "mlx5_ib (drivers/infiniband/hw/mlx5)",
    "drivers/nvidia": "the nvidia driver (nv-p2p, dma-buf exporter)",
    "drivers/amdgpu": "amdgpu/amdkfd",
    "peermem_clients": "peer-memory clients",
    "userspace": "userspace (libc)",
    "userspace/libibverbs": "libibverbs",
    "userspace/providers/mlx5": "libmlx5 (rdma-core providers/mlx5)",
    "userspace/libfabric": "libfabric fi_mr and the registration cache",
    "userspace/cuda": "the CUDA-like runtime",
    "userspace/hip": "the HIP-like runtime",
    "userspace/tools": "tools",
    "c_ext": "the C extension",
    "peermem_testing": "the testing kit",
    "scenarios": "scenarios",
}

MARK = re.compile(r"\bEMU:")
# A comment line that starts a comment of its own: a C label or a source citation
# ("# out_unmap:", "# umem.c: ..."), not the continuation of the note above.
LABEL = re.compile(r"^[A-Za-z_]\w*(?:[_.][\w.]*|\(\))+:(\s|$)")


@dataclass(frozen=True)
class Note:
    path: str    # relative to the repository, with /
    anchor: str  # "Class.method", "function" or "module"
    text: str    # the note, "EMU:" stripped, one line


def _scopes(tree: ast.Module) -> list[tuple[int, int, str]]:
    """(first line, last line, qualified name) of every class and function."""
    out: list[tuple[int, int, str]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                out.append((first, child.end_lineno or child.lineno, name))
                walk(child, name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


def _anchor(scopes: list[tuple[int, int, str]], line: int) -> str:
    best = ("module", -1)
    for first, last, name in scopes:
        if first <= line <= last and first > best[1]:
            best = (name, first)
    return best[0]


def _docstring_lines(tree: ast.Module) -> set[int]:
    """Line numbers covered by module, class and function docstrings."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                          | ast.AsyncFunctionDef):
            continue
        body = node.body
        if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            expr = body[0]
            lines.update(range(expr.lineno, (expr.end_lineno or expr.lineno) + 1))
    return lines


def _comments(source: str) -> dict[int, int]:
    """line -> column of the '#' of each real comment (tokenize's COMMENT tokens)."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.start[1]
    return out


def _until_close(text: str) -> tuple[str, bool]:
    """Cut `text` at the parenthesis closing the one opened before the note."""
    depth = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                return text[:i], True
            depth -= 1
    return text, False


def _note_text(lines: list[str], i: int, col: int | None, in_doc: bool) -> str:
    """The note starting on lines[i]; `col` is its real comment's '#' column, if any.

    The text runs from the marker to the end of the note: a comment's
    continuation lines (comment lines in the same column), a docstring note's
    paragraph, a note inside parentheses up to their close.  What stands before
    the marker is kept as context where it belongs to the note: the code a
    trailing comment sits on, a comment's words before its note, the clause a
    parenthesised docstring note belongs to.
    """
    line = lines[i]
    start = MARK.search(line, 0 if in_doc else col or 0)
    assert start is not None
    pre = ""
    code = ""
    if not in_doc:
        assert col is not None
        code = line[:col].strip()
        pre = line[col:start.start()].strip().lstrip("#:").strip().rstrip("#").strip()
        above = lines[i - 1] if i else ""
        continued = above.strip().startswith("#") and above.index("#") == col
        if not pre.endswith("(") and (pre.endswith(".") or continued):
            pre = ""  # the tail of a sentence begun above, not this note's own words
    else:
        before = line[:start.start()].rstrip().removesuffix("#").rstrip()
        if before.endswith("("):
            pre = before.strip().lstrip("\"'#").strip()
            if pre[:1].islower():
                pre = "... " + pre  # the clause began on a line above
    parts = [line[start.end():]]
    j = i + 1
    while not _ends_doc(parts[-1], in_doc) and j < len(lines):
        nxt = lines[j]
        stripped = nxt.strip()
        if not in_doc:
            # Continuation: a comment-only line whose '#' stands in the same column.
            if not stripped.startswith("#") or nxt.index("#") != col:
                break
            body = stripped[1:].strip()
            if not body or MARK.search(body) or LABEL.match(body):
                break
        else:
            # A docstring note runs to the end of its paragraph; a comment-style
            # block inside a docstring loses its '#'.
            body = stripped.removeprefix("#").strip()
            if not body or stripped.startswith(('"""', "'''")) or MARK.search(body) or (
                    stripped.startswith("#") and LABEL.match(body)):
                break
        parts.append(body)
        j += 1
    if in_doc:
        parts[-1] = re.split(r"\"\"\"|'''", parts[-1])[0]
    text = " ".join(" ".join(parts).split())
    text, closed = _until_close(text)
    text = text.strip()
    if pre.endswith("("):
        text = f"{pre}EMU: {text})"
    elif pre:
        text = f"{pre} EMU: {text}"
    if code and "`" not in code:
        text = f"`{code}` - {text}"
    return text


def _ends_doc(part: str, in_doc: bool) -> bool:
    return in_doc and ('"""' in part or "'''" in part)


def notes_in(path: pathlib.Path) -> list[Note]:
    """Every EMU note in one Python file, in line order."""
    source = path.read_text()
    if not MARK.search(source):
        return []       # half the files: no parse, no tokenize
    tree = ast.parse(source, str(path))
    scopes = _scopes(tree)
    docs = _docstring_lines(tree)
    comments = _comments(source)
    lines = source.splitlines()
    rel = path.relative_to(ROOT).as_posix()
    out = []
    for n, line in enumerate(lines, start=1):
        m = MARK.search(line)
        if not m:
            continue
        if n in comments and comments[n] < m.start():
            col, in_doc = comments[n], False
        elif n in docs:
            hash_at = line.rfind("#", 0, m.start())
            col, in_doc = (hash_at if hash_at >= 0 else None), True
        else:
            continue  # an ordinary string (output text), not a note
        if line[:m.start()].rstrip().endswith("marked #"):
            continue  # a mention of the convention, not a note
        text = _note_text(lines, n - 1, col, in_doc)
        out.append(Note(rel, _anchor(scopes, n), text))
    return out


def c_notes_in(path: pathlib.Path) -> list[Note]:
    """EMU notes in a C source or header: `/* EMU: ... */`, anchored to the file."""
    source = path.read_text()
    rel = path.relative_to(ROOT).as_posix()
    out = []
    for m in re.finditer(r"/\*(.*?)\*/", source, re.S):
        body = m.group(1)
        mark = MARK.search(body)
        if mark:
            text = " ".join(body[mark.end():].replace("*", " ").split())
            out.append(Note(rel, "file", text))
    return out


def collect(root: pathlib.Path = ROOT) -> list[Note]:
    notes: list[Note] = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if path.suffix == ".py":
                notes += notes_in(path)
            elif path.suffix in (".c", ".h"):
                notes += c_notes_in(path)
    return notes


def _escape(text: str) -> str:
    """Markdown-escape `<`, `>` and `*` outside code spans."""
    pieces = text.split("`")
    for k in range(0, len(pieces), 2):
        pieces[k] = (pieces[k].replace("\\", "\\\\").replace("*", "\\*")
                     .replace("<", "&lt;").replace(">", "&gt;"))
    if len(pieces) % 2 == 0:  # an unbalanced backtick: keep it literal
        return text.replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(pieces)


def render(notes: list[Note]) -> str:
    by_folder: dict[str, dict[str, list[Note]]] = {}
    for note in notes:
        folder = note.path.rsplit("/", 1)[0]
        by_folder.setdefault(folder, {}).setdefault(note.path, []).append(note)
    out = [
        "# Differences from the real kernel and libraries",
        "",
        "<!-- Generated by tools/gen_differences.py from the `# EMU:` notes in the code;",
        f"     do not edit by hand. Regenerate with: {REGENERATE} -->",
        "",
        "Where the emulator deliberately does something other than the code it mirrors,",
        "the code says so in a comment or docstring marked `EMU:`, with the reason. This",
        "page lists every such note, grouped by subsystem (folder) and file; each is",
        "anchored by the enclosing class or function (*module* for a module-level note),",
        "so `grep -n EMU: <file>` finds it. The architecture is in",
        "[architecture.md](architecture.md).",
        "",
        f"{len(notes)} notes in {sum(len(f) for f in by_folder.values())} files.",
        "",
        "## Subsystems",
        "",
    ]
    order = _folder_order(by_folder)
    for folder in order:
        count = sum(len(v) for v in by_folder[folder].values())
        out.append(f"- [`{folder}/`](#{_slug(folder)}) - {TITLES.get(folder, folder)}"
                   f" ({count})")
    for folder in order:
        out += ["", f"## {folder}", "", f"*{TITLES.get(folder, folder)}*"]
        for path, file_notes in by_folder[folder].items():
            out += ["", f"### `{path}`", ""]
            for note in file_notes:
                anchor = "*module*" if note.anchor in ("module", "file") else f"`{note.anchor}`"
                out.append(f"- {anchor}: {_escape(note.text)}")
    return "\n".join(out) + "\n"


def _folder_order(by_folder: dict[str, dict[str, list[Note]]]) -> list[str]:
    rank = {pkg: i for i, pkg in enumerate(PACKAGES)}
    return sorted(by_folder, key=lambda f: (rank.get(f.split("/")[0], 99), f))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = ap.parse_args(argv)
    text = render(collect())
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(ROOT)} is stale; regenerate with: {REGENERATE}",
                  file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
