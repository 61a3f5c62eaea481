"""Every document that code, tests and docs cite is in the repository.

Citations take the form `docs/reference/<file>.md §N` or a repository path such as
`docs/ARCHITECTURE.md`, `controller/RULES.md`; the section cited must exist as a heading in that file.
A section number cited without its file (which document?) or a path outside the repository is an error.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP = {".venv", ".git", ".pytest_cache", ".ruff_cache", ".hypothesis", "__pycache__", "node_modules"}
CITED_DOC = re.compile(r"(?<![\w/.-])((?:docs/reference|docs)/[\w.-]+\.md)(?:\s+§(\d+(?:\.\d+)?))?")
BARE = re.compile(r"(?<![\w/.-])reference \u00a7")
OUTSIDE = re.compile(r"(?<![\w.])\.\./\w[\w.-]*/")  # a path that leaves the repository


def _sources() -> list[Path]:
    out = []
    for path in ROOT.rglob("*"):
        if path.is_file() and path.suffix in (".py", ".md") and not SKIP & set(path.relative_to(ROOT).parts):
            if path.relative_to(ROOT).parts[:2] == ("docs", "reference") or path == Path(__file__).resolve():
                continue  # the references cite their own sources, not ours; this file names the patterns
            out.append(path)
    return out


def _sections(doc: Path) -> set[str]:
    heads = set()
    for line in doc.read_text().splitlines():
        m = re.match(r"#+\s+(\d+(?:\.\d+)*)[.\s]", line)
        if m:
            heads.add(m.group(1))
    return heads


def test_every_cited_document_and_section_exists() -> None:
    missing = []
    for src in _sources():
        text = src.read_text(errors="replace")
        for m in CITED_DOC.finditer(text):
            doc = ROOT / m.group(1)
            where = f"{src.relative_to(ROOT)}: {m.group(0)}"
            if not doc.is_file():
                missing.append(f"{where} (no such file)")
            elif m.group(2) and m.group(2) not in _sections(doc):
                missing.append(f"{where} (no section {m.group(2)})")
    assert not missing, "citations that do not resolve:\n" + "\n".join(missing)


def test_no_bare_reference_citations_or_paths_outside_the_repository() -> None:
    bad = []
    for src in _sources():
        for n, line in enumerate(src.read_text(errors="replace").splitlines(), 1):
            if BARE.search(line) or OUTSIDE.search(line):
                bad.append(f"{src.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bad, "say which document (docs/reference/<file> §N), inside the repository:\n" + "\n".join(bad)
