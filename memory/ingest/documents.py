"""Text out of uploaded or loaded files: plain text, Markdown, HTML and PDF.

A file becomes a `Document`: a name plus ordered `Section`s, each with the
place it came from (`position`): "page 3" for a PDF, the heading path
("Install > Linux") for Markdown and HTML. Sections are the unit the chunker
never crosses, so a search result can always say where its text sits.
"""

from __future__ import annotations

import codecs
import io
import logging
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import PurePath

log = logging.getLogger(__name__)

MARKDOWN_SUFFIXES = {".md", ".markdown", ".mdown", ".mkd"}
TEXT_SUFFIXES = {".txt", ".text", ".rst", ".csv", ".tsv", ".log", ".json", ".yaml", ".yml"}
HTML_SUFFIXES = {".html", ".htm", ".xhtml"}
PDF_SUFFIXES = {".pdf"}
SUPPORTED_SUFFIXES = MARKDOWN_SUFFIXES | TEXT_SUFFIXES | HTML_SUFFIXES | PDF_SUFFIXES
PATH_SEPARATOR = " > "

_ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_FRONT_MATTER = re.compile(r"\A---[ \t]*\n.*?\n(?:---|\.\.\.)[ \t]*(?:\n|\Z)", re.DOTALL)
_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
_SPACES = re.compile(r"[ \t\r\f\v\u00a0]+")


class DocumentError(ValueError):
    """A file that cannot be read as a document; the message names the reason."""


@dataclass(slots=True)
class Section:
    text: str
    position: str = ""


@dataclass(slots=True)
class Document:
    name: str
    sections: list[Section] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n\n".join(section.text for section in self.sections)


def document_kind(filename: str, content_type: str = "") -> str | None:
    """ "pdf", "html", "markdown" or "text" for a supported file; None otherwise."""
    suffix = PurePath(filename).suffix.lower()
    mime = content_type.split(";", 1)[0].strip().lower()
    if suffix in PDF_SUFFIXES or mime == "application/pdf":
        return "pdf"
    if suffix in HTML_SUFFIXES or mime in ("text/html", "application/xhtml+xml"):
        return "html"
    if suffix in MARKDOWN_SUFFIXES or mime == "text/markdown":
        return "markdown"
    if suffix in TEXT_SUFFIXES or mime.startswith("text/"):
        return "text"
    return None


def extract_document(filename: str, data: bytes, content_type: str = "") -> Document:
    """The file as sections; DocumentError (with the reason) if it cannot be read."""
    kind = document_kind(filename, content_type)
    if kind is None:
        what = PurePath(filename).suffix.lower() or content_type or "without an extension"
        raise DocumentError(f"unsupported file type {what!r} (text, Markdown, HTML or PDF)")
    if kind == "pdf":
        sections = _pdf_sections(data)
    elif kind == "html":
        sections = html_sections(_decode(data, _html_charset(data)))
    elif kind == "markdown":
        sections = markdown_sections(_FRONT_MATTER.sub("", _decode(data), count=1))
    else:
        sections = [Section(text)] if (text := _decode(data).strip()) else []
    if not sections:
        raise DocumentError("no text found in the file" + (" (a scanned PDF?)" if kind == "pdf" else ""))
    return Document(filename, sections)


def extract_text(filename: str, data: bytes, content_type: str = "") -> str:
    """The whole text, headings kept as Markdown `#` lines (so chunk_text finds them)."""
    return extract_document(filename, data, content_type).text


# -- plain text ------------------------------------------------------------------
def _decode(data: bytes, charset: str | None = None) -> str:
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return data.decode("utf-16")
    if b"\x00" in data[:8192]:
        raise DocumentError("the file looks binary, not text")
    for encoding in (charset, "utf-8-sig"):
        if encoding:
            try:
                return data.decode(encoding)
            except (UnicodeDecodeError, LookupError):
                continue
    # Not UTF-8: most such files in the wild are Windows-1252; replace what is not.
    return data.decode("cp1252", errors="replace")


# -- Markdown --------------------------------------------------------------------
class _SectionBuilder:
    """Paragraphs under a heading stack -> sections named by their heading path.

    A section holding nothing but headings (a title right above a subtitle)
    is folded into the next one, so no passage is a bare title.
    """

    def __init__(self) -> None:
        self.sections: list[Section] = []
        self._path: list[tuple[int, str]] = []
        self._lines: list[str] = []
        self._has_body = False

    def heading(self, level: int, title: str, line: str) -> None:
        title = " ".join(title.split())
        if self._has_body:
            self._flush()
        while self._path and self._path[-1][0] >= level:
            self._path.pop()
        if title:
            self._path.append((level, title))
        self._lines.append(line)

    def paragraph(self, text: str) -> None:
        if text.strip():
            self._lines.append(text)
            self._has_body = True

    def _flush(self) -> None:
        text = "\n\n".join(line.strip("\n") for line in self._lines).strip()
        if text:
            self.sections.append(Section(text, PATH_SEPARATOR.join(title for _, title in self._path)))
        self._lines, self._has_body = [], False

    def finish(self) -> list[Section]:
        self._flush()
        return self.sections


def markdown_sections(text: str) -> list[Section]:
    """Split at ATX headings (`#` to `######`), never inside fenced code."""
    builder = _SectionBuilder()
    paragraph: list[str] = []
    fence = ""

    def end_paragraph() -> None:
        if paragraph:
            builder.paragraph("\n".join(paragraph).strip("\n"))
            paragraph.clear()

    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if fence:
            paragraph.append(line)
            if line.strip().startswith(fence):
                fence = ""
            continue
        opening = _FENCE.match(line)
        if opening:
            fence = opening.group(1)[0] * 3
            paragraph.append(line)
            continue
        heading = _ATX_HEADING.match(line)
        if heading:
            end_paragraph()
            builder.heading(len(heading.group(1)), heading.group(2) or "", line.strip())
        elif line.strip():
            paragraph.append(line.rstrip())
        else:
            end_paragraph()
    end_paragraph()
    return builder.finish()


# -- HTML ------------------------------------------------------------------------
# Page chrome and non-text: never part of a passage.
_SKIP_TAGS = {
    "script",
    "style",
    "noscript",
    "template",
    "svg",
    "math",
    "canvas",
    "iframe",
    "object",
    "head",
    "title",
    "nav",
    "aside",
    "footer",
    "form",
    "button",
    "select",
}
_BLOCK_TAGS = {
    "p",
    "div",
    "section",
    "article",
    "main",
    "header",
    "blockquote",
    "pre",
    "table",
    "tr",
    "ul",
    "ol",
    "dl",
    "dt",
    "dd",
    "figure",
    "figcaption",
    "details",
    "summary",
    "hr",
    "address",
}
_HEADINGS = {f"h{level}": level for level in range(1, 7)}
_VOID_TAGS = {"br", "hr", "img", "input", "meta", "link", "area", "base", "col", "embed", "source", "track", "wbr"}


class _HTMLText(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.builder = _SectionBuilder()
        self._skip: list[str] = []  # open skipped elements, innermost last
        self._buffer: list[str] = []
        self._heading: int | None = None
        self._pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._skip:
            if tag == self._skip[-1] and tag not in _VOID_TAGS:
                self._skip.append(tag)
            return
        hidden = any(name == "hidden" or (name == "aria-hidden" and value == "true") for name, value in attrs)
        if tag in _SKIP_TAGS or (hidden and tag not in _VOID_TAGS):
            self._skip.append(tag)
            return
        if tag in _HEADINGS:
            self._end_block()
            self._heading = _HEADINGS[tag]
        elif tag == "li":
            self._end_block()
            self._buffer.append("- ")
        elif tag in ("td", "th"):
            self._buffer.append(" | ")
        elif tag == "br":
            self._buffer.append("\n")
        elif tag in _BLOCK_TAGS:
            self._end_block()
            self._pre += tag == "pre"

    def handle_endtag(self, tag: str) -> None:
        if self._skip:
            if tag == self._skip[-1]:
                self._skip.pop()
            return
        if tag in _HEADINGS and self._heading is not None:
            title = " ".join("".join(self._buffer).split())
            self._buffer.clear()
            if title:
                self.builder.heading(self._heading, title, f"{'#' * self._heading} {title}")
            self._heading = None
        elif tag in _BLOCK_TAGS or tag == "li":
            self._end_block()
            if tag == "pre":
                self._pre = max(0, self._pre - 1)

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self._buffer.append(data if self._pre else _SPACES.sub(" ", data))

    def _end_block(self) -> None:
        if self._heading is not None:
            return  # a block inside a heading: the heading collects it
        text = "".join(self._buffer)
        self._buffer.clear()
        if not self._pre:
            text = "\n".join(" ".join(line.split()) for line in text.split("\n"))
            text = re.sub(r"\n{2,}", "\n", text).strip()
        if text and text != "-":
            self.builder.paragraph(text)

    def close(self) -> None:
        super().close()
        self._heading = None
        self._end_block()


def html_sections(html: str) -> list[Section]:
    parser = _HTMLText()
    parser.feed(html)
    parser.close()
    return parser.builder.finish()


def _html_charset(data: bytes) -> str | None:
    match = _CHARSET.search(data[:4096])
    return match.group(1).decode("ascii") if match else None


# -- PDF -------------------------------------------------------------------------
def _pdf_sections(data: bytes) -> list[Section]:
    from pypdf import PdfReader

    if b"%PDF-" not in data[:1024]:
        raise DocumentError("not a PDF (no %PDF header)")
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise DocumentError("the PDF is password-protected")
        sections = []
        for number, page in enumerate(reader.pages, 1):
            text = (page.extract_text() or "").strip()
            if text:
                sections.append(Section(text, f"page {number}"))
    except DocumentError:
        raise
    except Exception as error:
        # pypdf raises many exception types on damaged files (PdfReadError,
        # KeyError, TypeError, ...); each one means "this PDF cannot be read".
        log.debug("PDF extraction failed", exc_info=True)
        raise DocumentError(f"not a readable PDF ({type(error).__name__}: {error})") from None
    return sections
