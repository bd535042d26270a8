"""Extraction (text, Markdown, HTML, PDF) and token-aware chunking, with real
tiktoken counts and real PDFs."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory.ingest.chunking import chunk_sections, chunk_text
from memory.ingest.documents import (
    Document,
    DocumentError,
    Section,
    extract_document,
    extract_text,
    markdown_sections,
)
from memory.tokens import TokenCounter, load_encoder

COUNTER = TokenCounter(load_encoder("gpt-4"))


def make_pdf(pages: list[str]) -> bytes:
    """A real, minimal PDF: one Helvetica text page per item ("" is a blank page)."""

    def escape(line: str) -> str:
        return line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    page_ids = [4 + 2 * n for n in range(len(pages))]
    objects: dict[int, bytes] = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        2: f"<< /Type /Pages /Kids [{' '.join(f'{i} 0 R' for i in page_ids)}] /Count {len(pages)} >>".encode(),
        3: b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    }
    for page_id, text in zip(page_ids, pages, strict=True):
        shown = " ".join(f"({escape(line)}) Tj T*" for line in text.split("\n")) if text else ""
        stream = f"BT /F1 11 Tf 14 TL 72 720 Td {shown} ET".encode("latin-1")
        objects[page_id] = (
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {page_id + 1} 0 R >>"
        ).encode()
        objects[page_id + 1] = b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream)
    out = bytearray(b"%PDF-1.4\n")
    offsets: dict[int, int] = {}
    for number in sorted(objects):
        offsets[number] = len(out)
        out += b"%d 0 obj\n%s\nendobj\n" % (number, objects[number])
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offsets[number] for number in sorted(objects))
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


# -- extraction -------------------------------------------------------------------
def test_pdf_one_section_per_page_with_page_numbers() -> None:
    data = make_pdf(["Tomatoes need full sun.", "", "Basil likes warm nights.\nWater it in the morning."])
    document = extract_document("garden.pdf", data)
    assert [s.position for s in document.sections] == ["page 1", "page 3"]  # the blank page has no text
    assert "Tomatoes need full sun." in document.sections[0].text
    assert "Water it in the morning." in document.sections[1].text
    # Same answer by content type, whatever the name.
    assert extract_document("upload", data, "application/pdf").sections == document.sections


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"this is not a pdf at all", "no %PDF header"),
        (b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\ntrailer <<>>\n%%EOF", "not a readable PDF"),
        (make_pdf(["cut short"])[:60], "not a readable PDF"),
    ],
)
def test_damaged_pdfs_raise_document_error_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(DocumentError, match=reason):
        extract_document("broken.pdf", data)


def test_scanned_pdf_without_text_is_an_error() -> None:
    with pytest.raises(DocumentError, match="no text"):
        extract_document("scan.pdf", make_pdf(["", ""]))


def test_markdown_sections_follow_the_heading_path() -> None:
    text = (
        "---\ntitle: Guide\n---\n"
        "Intro before any heading.\n\n"
        "# Install\n\n## Linux\n\nUse the package.\n\n"
        "```sh\n# not a heading: a shell comment\n\napt install garden\n```\n\n"
        "## macOS ##\n\nUse brew.\n\n"
        "# Use\n\n#hashtag is not a heading either.\n"
    )
    sections = markdown_sections(text.split("---\n", 2)[2])
    assert [s.position for s in sections] == ["", "Install > Linux", "Install > macOS", "Use"]
    # A bare title is folded into the section below it, never a passage of its own.
    assert sections[1].text.startswith("# Install\n\n## Linux\n\nUse the package.")
    assert "# not a heading: a shell comment\n\napt install garden" in sections[1].text
    assert sections[3].text == "# Use\n\n#hashtag is not a heading either."
    # Front matter is dropped when a Markdown file is extracted.
    document = extract_document("guide.md", text.encode())
    assert "title: Guide" not in document.text and document.sections[0].text == "Intro before any heading."


def test_html_keeps_text_and_headings_and_drops_page_chrome() -> None:
    html = """<!doctype html><html><head><meta charset="utf-8"><title>Garden</title>
    <style>body { color: red }</style><script>var tracking = "SECRET";</script></head>
    <body><nav><a href="/">Home</a> | <a href="/shop">Shop</a></nav>
    <h1>Install &amp; set&nbsp;up</h1><p>Read   this <b>first</b>.</p>
    <h2>Linux</h2><ul><li>Debian</li><li>Fedora</li></ul>
    <pre>apt  install\n  garden</pre>
    <div hidden>invisible</div><aside>Related posts</aside>
    <h2>Windows</h2><table><tr><td>x86</td><td>ARM</td></tr></table>
    <footer>(c) 2024</footer><script>alert(1)</script></body></html>"""
    document = extract_document("page.html", html.encode())
    text = document.text
    for gone in ("SECRET", "color: red", "Home", "Shop", "invisible", "Related posts", "(c) 2024", "alert", "Garden"):
        assert gone not in text
    assert [s.position for s in document.sections] == [
        "Install & set up",
        "Install & set up > Linux",
        "Install & set up > Windows",
    ]
    assert document.sections[0].text == "# Install & set up\n\nRead this first."
    assert "## Linux" in document.sections[1].text and "- Debian" in document.sections[1].text
    assert "apt  install\n  garden" in document.sections[1].text  # <pre> keeps its spacing
    assert "x86" in document.sections[2].text and "ARM" in document.sections[2].text
    # As plain text (the runtime's old API) the headings are Markdown lines chunk_text understands.
    assert [c.position for c in chunk_text(extract_text("page.html", html.encode()), COUNTER)] == [
        s.position for s in document.sections
    ]


def test_text_encodings_and_unreadable_files() -> None:
    assert extract_text("a.txt", "caf\u00e9 \u2019quoted\u2019".encode("cp1252")) == "caf\u00e9 \u2019quoted\u2019"
    assert extract_text("b.txt", "\ufeffnaïve".encode()) == "naïve"
    assert extract_text("c.txt", "utf-16 text".encode("utf-16")) == "utf-16 text"
    # In a plain text file a '#' line is text, not a heading.
    assert extract_document("d.txt", b"# not a heading\n\nbody").sections == [Section("# not a heading\n\nbody")]
    with pytest.raises(DocumentError, match="binary"):
        extract_document("e.txt", b"\x00\x01\x02binary")
    with pytest.raises(DocumentError, match="no text"):
        extract_document("f.md", b"  \n\n ")
    with pytest.raises(DocumentError, match=r"unsupported file type '\.png'"):
        extract_document("cat.png", b"\x89PNG")


# -- chunking ---------------------------------------------------------------------
WORDS = "water tomato basil soil compost dawn noon shade seed root leaf harvest pepper frost mulch".split()


def prose(sentences: int, seed: int) -> str:
    out = []
    for n in range(sentences):
        length = 4 + (seed * 7 + n * 13) % 17
        words = [WORDS[(seed + n * 3 + k * 5) % len(WORDS)] for k in range(length)]
        out.append(" ".join(words).capitalize() + ".")
    return " ".join(out)


def test_no_chunk_over_the_limit_and_consecutive_chunks_overlap() -> None:
    paragraphs = [prose(3 + n % 9, n) for n in range(30)] + [prose(60, 99)]  # the last one is far over a chunk
    text = "# Planting\n\n" + "\n\n".join(paragraphs)
    chunks = chunk_text(text, COUNTER, max_tokens=80, overlap_tokens=20)
    assert len(chunks) > 10
    assert all(COUNTER.count(chunk.text) <= 80 and chunk.tokens == COUNTER.count(chunk.text) for chunk in chunks)
    assert {chunk.position for chunk in chunks} == {"Planting"}
    overlapping = 0
    for before, after in itertools.pairwise(chunks):
        first = after.text.split("\n\n")[0]
        if first in paragraphs and COUNTER.count(first) > 80 - 20 - 1:
            continue  # a whole paragraph that fills the passage leaves no room to repeat anything
        # The next passage starts with words that end the previous one.
        opening = " ".join(after.text.split()[:3])
        assert opening in before.text[-(len(after.text) // 2 + 200) :], (before.text, after.text)
        overlapping += 1
    assert overlapping >= len(chunks) // 2
    # Nothing is lost: every sentence of the input is in some passage.
    joined = " ".join(" ".join(chunk.text.split()) for chunk in chunks)
    for sentence in re.split(r"(?<=\.) ", " ".join(paragraphs)):
        assert sentence in joined


def test_a_new_heading_starts_a_new_passage() -> None:
    handbook = "# Watering\n\nWater tomatoes at dawn, never at noon.\n\n# Soil\n\nUse compost rich in nitrogen."
    chunks = chunk_text(handbook, COUNTER)
    assert [(c.position, c.text) for c in chunks] == [
        ("Watering", "# Watering\n\nWater tomatoes at dawn, never at noon."),
        ("Soil", "# Soil\n\nUse compost rich in nitrogen."),
    ]


def test_pages_are_never_merged_and_keep_their_positions() -> None:
    document = Document("book.pdf", [Section(prose(40, 1), "page 1"), Section("Short page.", "page 2")])
    chunks = chunk_sections(document.sections, COUNTER, max_tokens=60, overlap_tokens=10)
    assert chunks[-1] == chunks[-1].__class__("Short page.", "page 2", COUNTER.count("Short page."))
    assert all(chunk.position == "page 1" for chunk in chunks[:-1]) and len(chunks) > 3


def test_words_longer_than_a_chunk_and_lines_without_sentences_are_cut() -> None:
    blob = "A" * 3000
    listing = "\n".join(f"line {n}: value {n * 7}" for n in range(200))
    chunks = chunk_sections([Section(f"Data follows. {blob} Done."), Section(listing, "table")], COUNTER, 50, 10)
    assert all(COUNTER.count(chunk.text) <= 50 for chunk in chunks)
    assert "".join(chunk.text for chunk in chunks).count("A") >= 3000
    table = [chunk.text for chunk in chunks if chunk.position == "table"]
    assert "line 0: value 0\nline 1: value 7" in table[0]  # line breaks are kept inside a passage
    assert "line 199: value 1393" in table[-1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=st.text(alphabet=st.sampled_from(list("abcdefgh  ..!?\n\n#é漢🙂")), min_size=0, max_size=1500),
    max_tokens=st.integers(16, 120),
    overlap=st.integers(0, 60),
)
def test_any_text_chunks_within_the_limit(text: str, max_tokens: int, overlap: int) -> None:
    chunks = chunk_text(text, COUNTER, max_tokens, overlap)
    assert all(COUNTER.count(chunk.text) <= max_tokens for chunk in chunks)
    assert all(chunk.text.strip() for chunk in chunks)
    if text.strip(" .!?\n#"):
        assert chunks
