"""The project's written docs: README.md and docs/*.md. Tests that hold a figure, a table or a
sentence to the docs read them as one text (`all_text`), so a passage may move between pages
without its test losing it."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"


def all_text() -> str:
    pages = [README, *sorted(DOCS.glob("*.md"))]
    return "\n".join(p.read_text(encoding="utf-8") for p in pages)
