"""Text out of uploaded or loaded files: plain text, Markdown, HTML and PDF.

A file becomes a `Document`: a name plus ordered `Section`s, each with the
place it came from (`position`): "page 3" for a PDF, the heading path
("Install > Linux") for Markdown and HTML. Sections are the unit the chunker
never crosses, so a search result can always say where its text sits.

Large files are read as a stream (`scan_file`, then `stream_sections`), so
memory does not grow with file size: text and Markdown line by line, HTML
through the incremental HTMLParser, PDF page by page (pypdf reads objects from
the open file as pages need them, but keeps what it parsed for the life of the
reader: a PDF's memory still grows with its page count). A section longer than
`SECTION_PART_CHARS` (a heading-less text file is one section) is handed on
in parts cut at paragraph breaks, each marked `continues`, so the chunker packs
them as one section.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import PurePath
from typing import BinaryIO

log = logging.getLogger(__name__)

MARKDOWN_SUFFIXES = {".md", ".markdown", ".mdown", ".mkd"}
TEXT_SUFFIXES = {".txt", ".text", ".rst", ".csv", ".tsv", ".log", ".json", ".yaml", ".yml"}
HTML_SUFFIXES = {".html", ".htm", ".xhtml"}
PDF_SUFFIXES = {".pdf"}
PATH_SEPARATOR = " > "
# Bytes per read of a streamed file, and characters of a section handed on at
# once: small next to any model batch, large enough that reads cost nothing.
READ_BYTES = 64 * 1024
SECTION_PART_CHARS = 64 * 1024
# A part with no paragraph break in sight is cut at a line after this much.
SECTION_PART_HARD_CHARS = 4 * SECTION_PART_CHARS
# Front matter longer than this many lines is taken for text, not buffered on.
FRONT_MATTER_MAX_LINES = 1000

_ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_FRONT_MATTER_OPEN = re.compile(r"---[ \t]*")
_FRONT_MATTER_CLOSE = re.compile(r"(?:---|\.\.\.)[ \t]*")
_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
_SPACES = re.compile(r"[ \t\r\f\v\u00a0]+")


class DocumentError(ValueError):
    """A file that cannot be read as a document; the message names the reason."""


@dataclass(slots=True)
class Section:
    text: str
    position: str = ""
    # More of the section before it (a long section, streamed in parts).
    continues: bool = False


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


def _kind_or_error(filename: str, content_type: str) -> str:
    kind = document_kind(filename, content_type)
    if kind is None:
        what = PurePath(filename).suffix.lower() or content_type or "without an extension"
        raise DocumentError(f"unsupported file type {what!r} (text, Markdown, HTML or PDF)")
    return kind


def extract_document(filename: str, data: bytes, content_type: str = "") -> Document:
    """The file as sections; DocumentError (with the reason) if it cannot be read."""
    scanned = scan_file(filename, io.BytesIO(data), content_type)
    return Document(filename, _joined_parts(stream_sections(io.BytesIO(data), scanned)))


def extract_text(filename: str, data: bytes, content_type: str = "") -> str:
    """The whole text, headings kept as Markdown `#` lines (so chunk_text finds them)."""
    return extract_document(filename, data, content_type).text


def _joined_parts(sections: Iterable[Section]) -> list[Section]:
    whole: list[Section] = []
    for section in sections:
        if section.continues and whole:
            whole[-1].text += "\n\n" + section.text
        else:
            whole.append(Section(section.text, section.position))
    return whole


# -- streaming ---------------------------------------------------------------------
@dataclass(slots=True, frozen=True)
class ScannedFile:
    """What one pass over a file's bytes tells: its content key and how to read it."""

    sha256: str
    kind: str
    encoding: str = ""  # text kinds; "cp1252" means not valid in any better one (errors replaced)


def scan_file(filename: str, stream: BinaryIO, content_type: str = "") -> ScannedFile:
    """Hash the file and, for text kinds, find the encoding it is valid in,
    reading it in READ_BYTES blocks. DocumentError for an unsupported type or
    binary data in a text file."""
    kind = _kind_or_error(filename, content_type)
    digest = hashlib.sha256()
    first = stream.read(READ_BYTES)
    digest.update(first)
    if kind == "pdf":
        for block in iter(lambda: stream.read(READ_BYTES), b""):
            digest.update(block)
        return ScannedFile(digest.hexdigest(), kind)
    if first.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        for block in iter(lambda: stream.read(READ_BYTES), b""):
            digest.update(block)
        return ScannedFile(digest.hexdigest(), kind, "utf-16")
    if b"\x00" in first[:8192]:
        raise DocumentError("the file looks binary, not text")
    # Candidates in order of preference; the first one the whole file is valid in wins.
    charset = _html_charset(first) if kind == "html" else None
    decoders: dict[str, codecs.IncrementalDecoder] = {}
    for encoding in (charset, "utf-8-sig"):
        if encoding and encoding not in decoders:
            try:
                decoders[encoding] = codecs.getincrementaldecoder(encoding)()
            except LookupError:
                continue
    block = first
    while True:
        final = not block
        for encoding, decoder in list(decoders.items()):
            try:
                decoder.decode(block, final)
            except UnicodeDecodeError:
                del decoders[encoding]
        if final:
            break
        block = stream.read(READ_BYTES)
        digest.update(block)
    # Not UTF-8: most such files in the wild are Windows-1252; replace what is not.
    return ScannedFile(digest.hexdigest(), kind, next(iter(decoders), "cp1252"))


def stream_sections(stream: BinaryIO, scanned: ScannedFile) -> Iterator[Section]:
    """The file's sections, read as they are needed (see the module's notes);
    DocumentError, raised while iterating, if it cannot be read."""
    found = False
    for section in _sections(stream, scanned):
        found = True
        yield section
    if not found:
        raise DocumentError("no text found in the file" + (" (a scanned PDF?)" if scanned.kind == "pdf" else ""))


def _sections(stream: BinaryIO, scanned: ScannedFile) -> Iterator[Section]:
    if scanned.kind == "pdf":
        yield from _pdf_sections(stream)
        return
    errors = "replace" if scanned.encoding == "cp1252" else "strict"
    # newline=None: "\r\n" and "\r" read as "\n", whatever the file's platform.
    text = io.TextIOWrapper(stream, encoding=scanned.encoding, errors=errors, newline=None)
    if scanned.kind == "html":
        yield from _html_stream(text)
    elif scanned.kind == "markdown":
        yield from iter_markdown_sections(_without_front_matter(line.rstrip("\n") for line in text))
    else:
        yield from _text_parts(text)


def _text_parts(lines: Iterable[str]) -> Iterator[Section]:
    """Plain text: one section, in parts cut before a blank line (a paragraph
    break, so packing the parts one after another is packing the whole)."""
    buffer: list[str] = []
    size = 0
    continues = False
    for line in lines:
        if size >= SECTION_PART_HARD_CHARS or (size >= SECTION_PART_CHARS and not line.strip(" \t\n")):
            part = "".join(buffer).strip()
            if part:
                yield Section(part, continues=continues)
                continues = True
            buffer, size = [], 0
        buffer.append(line)
        size += len(line)
    part = "".join(buffer).strip()
    if part:
        yield Section(part, continues=continues)


# -- Markdown --------------------------------------------------------------------
class _SectionBuilder:
    """Paragraphs under a heading stack -> sections named by their heading path.

    A section holding nothing but headings (a title right above a subtitle)
    is folded into the next one, so no passage is a bare title. Finished
    sections wait in `sections` until the reader takes them; a long section
    is let out in parts of about SECTION_PART_CHARS.
    """

    def __init__(self) -> None:
        self.sections: list[Section] = []
        self._path: list[tuple[int, str]] = []
        self._lines: list[str] = []
        self._chars = 0
        self._has_body = False
        self._in_parts = False  # a part of the current section was let out

    def heading(self, level: int, title: str, line: str) -> None:
        title = " ".join(title.split())
        if self._has_body or self._in_parts:
            self._flush(more=False)
        while self._path and self._path[-1][0] >= level:
            self._path.pop()
        if title:
            self._path.append((level, title))
        self._lines.append(line)

    def paragraph(self, text: str) -> None:
        if text.strip():
            self._lines.append(text)
            self._chars += len(text)
            self._has_body = True
            if self._chars >= SECTION_PART_CHARS:
                self._flush(more=True)

    def _flush(self, *, more: bool) -> None:
        text = "\n\n".join(line.strip("\n") for line in self._lines).strip()
        if text:
            position = PATH_SEPARATOR.join(title for _, title in self._path)
            self.sections.append(Section(text, position, continues=self._in_parts))
        self._lines, self._chars, self._has_body = [], 0, False
        self._in_parts = more

    def take(self) -> list[Section]:
        sections, self.sections = self.sections, []
        return sections

    def finish(self) -> list[Section]:
        self._flush(more=False)
        return self.take()


def markdown_sections(text: str) -> list[Section]:
    """Split at ATX headings (`#` to `######`), never inside fenced code."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return _joined_parts(iter_markdown_sections(lines))


def iter_markdown_sections(lines: Iterable[str]) -> Iterator[Section]:
    """markdown_sections over lines (without their line ends), as they come."""
    builder = _SectionBuilder()
    paragraph: list[str] = []
    fence = ""

    def end_paragraph() -> None:
        if paragraph:
            builder.paragraph("\n".join(paragraph).strip("\n"))
            paragraph.clear()

    for line in lines:
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
        if builder.sections:
            yield from builder.take()
    end_paragraph()
    yield from builder.finish()


def _without_front_matter(lines: Iterable[str]) -> Iterator[str]:
    """Lines after a leading YAML front matter block (`---` ... `---` or `...`);
    an opening with no close within FRONT_MATTER_MAX_LINES is kept as text."""
    lines = iter(lines)
    first = next(lines, None)
    if first is None:
        return
    if not _FRONT_MATTER_OPEN.fullmatch(first):
        yield first
        yield from lines
        return
    held = [first]
    for line in lines:
        held.append(line)
        # At least one line between the fences (an empty one will do).
        if len(held) > 2 and _FRONT_MATTER_CLOSE.fullmatch(line):
            yield from lines
            return
        if len(held) > FRONT_MATTER_MAX_LINES:
            break
    yield from held
    yield from lines


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


def _html_stream(text: io.TextIOBase) -> Iterator[Section]:
    parser = _HTMLText()
    for block in iter(lambda: text.read(SECTION_PART_CHARS), ""):
        parser.feed(block)
        yield from parser.builder.take()
    parser.close()
    yield from parser.builder.finish()


def _html_charset(data: bytes) -> str | None:
    match = _CHARSET.search(data[:4096])
    return match.group(1).decode("ascii") if match else None


# -- PDF -------------------------------------------------------------------------
def _pdf_sections(stream: BinaryIO) -> Iterator[Section]:
    from pypdf import PdfReader

    if b"%PDF-" not in stream.read(1024):
        raise DocumentError("not a PDF (no %PDF header)")
    stream.seek(0)
    try:
        reader = PdfReader(stream)
        if reader.is_encrypted and not reader.decrypt(""):
            raise DocumentError("the PDF is password-protected")
        for number, page in enumerate(reader.pages, 1):
            text = (page.extract_text() or "").strip()
            if text:
                yield Section(text, f"page {number}")
    except DocumentError:
        raise
    except Exception as error:
        # pypdf raises many exception types on damaged files (PdfReadError,
        # KeyError, TypeError, ...); each one means "this PDF cannot be read".
        log.debug("PDF extraction failed", exc_info=True)
        raise DocumentError(f"not a readable PDF ({type(error).__name__}: {error})") from None
