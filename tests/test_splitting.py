"""Property tests for reply splitting: no chunk over the limit, nothing lost,
order kept, code fences balanced in every chunk."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.splitting import split_message

FENCE_LINE = re.compile(r"^[ \t]*```[^\n]*$", re.MULTILINE)


def content(text: str) -> str:
    """What must survive: every non-space character outside fence lines, in order."""
    return re.sub(r"\s+", "", FENCE_LINE.sub("", text))


words = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="`"), min_size=1, max_size=40)
pieces = st.one_of(
    words,
    st.just(" "),
    st.just("\n"),
    st.just("\n\n"),
    st.just(". "),
    st.just("! "),
    st.builds(
        lambda lang, body: f"\n```{lang}\n{body}\n```\n",
        st.sampled_from(["", "python", "js"]),
        st.text(min_size=0, max_size=600),
    ),
    st.builds(lambda n: "x" * n, st.integers(min_value=50, max_value=3000)),
)
messages = st.lists(pieces, min_size=1, max_size=60).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=messages, limit=st.sampled_from([64, 100, 500, 2000, 4000]))
def test_split_properties(text: str, limit: int) -> None:
    chunks = split_message(text, limit)
    assert chunks
    assert all(len(chunk) <= limit for chunk in chunks)
    assert content("\n".join(chunks)) == content(text)
    for chunk in chunks:
        assert len(FENCE_LINE.findall(chunk)) % 2 == 0 or len(FENCE_LINE.findall(text)) % 2 == 1


def test_prefers_paragraph_then_sentence_boundaries() -> None:
    text = ("First paragraph sentence one. " * 30).strip() + "\n\n" + "Second paragraph. " * 30
    chunks = split_message(text, 1000)
    assert chunks[0].endswith("sentence one.")
    assert all(chunk.endswith((".", "one.")) for chunk in chunks)


def test_code_block_is_closed_and_reopened_with_its_language() -> None:
    code = "\n".join(f"print('line {i}')" for i in range(300))
    text = f"Here is the script:\n```python\n{code}\n```\nDone."
    chunks = split_message(text, 2000)
    assert len(chunks) >= 3
    assert all(len(c) <= 2000 for c in chunks)
    for chunk in chunks[1:-1]:
        assert chunk.startswith("```python\n") and chunk.endswith("```")
    assert chunks[0].endswith("```") and chunks[-1].endswith("Done.")


def test_short_text_is_one_chunk() -> None:
    assert split_message("hello", 2000) == ["hello"]
