"""Text out of uploaded or loaded files (plain text, Markdown, PDF)."""

from __future__ import annotations

import io
from pathlib import PurePath

TEXT_SUFFIXES = {".txt", ".md", ".markdown", ".rst", ".csv", ".log", ".json", ".yaml", ".yml"}


class DocumentError(ValueError):
    """A file that cannot be read as a document; the message names the reason."""


def extract_text(filename: str, data: bytes, content_type: str = "") -> str:
    suffix = PurePath(filename).suffix.lower()
    if suffix == ".pdf" or content_type == "application/pdf":
        return _pdf_text(data)
    if suffix in TEXT_SUFFIXES or content_type.startswith("text/"):
        return data.decode("utf-8", errors="replace")
    raise DocumentError(f"unsupported file type {suffix or content_type or 'unknown'!r} (text, Markdown or PDF)")


def _pdf_text(data: bytes) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        pages = [page.extract_text() or "" for page in reader.pages]
    except (PdfReadError, ValueError, KeyError, OSError) as error:
        raise DocumentError(f"not a readable PDF ({error})") from None
    return "\n\n".join(pages)
