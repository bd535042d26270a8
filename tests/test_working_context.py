"""Working context by place (memory/working_context.py): what each place is
shown, what an edit from there may touch, the whole block's limit, sharing."""

from __future__ import annotations

import re

import pytest

from memory.places import DM, Place
from memory.types import OPERATOR_KEY, Block, BlockLine
from memory.working_context import (
    DEFAULT_HUMAN,
    DEFAULT_PERSONA,
    PRIVATE_BLOCK,
    MemoryEditError,
    WorkingContext,
    default_blocks,
    lines_from_before_places,
)

PUBLIC = Place("public", "C1", "#general")
OTHER_PUBLIC = Place("public", "C2", "#random")
TEAM = Place("private", "G1", "#team")
OTHER_TEAM = Place("private", "G2", "#other")


def context(human_limit: int = 200) -> WorkingContext:
    return WorkingContext(default_blocks(400, human_limit, private_limit=100))


def human_shown(wc: WorkingContext, place: Place) -> str:
    return wc.shown("human", place)


def edit(wc: WorkingContext, block: Block) -> Block:
    wc.commit(block)
    return block


def test_each_place_is_shown_only_the_lines_it_may_read() -> None:
    wc = context()
    edit(wc, wc.append("human", "diagnosed with hypothyroidism", DM))
    edit(wc, wc.append("human", "works on the atlas project", TEAM))
    edit(wc, wc.append("human", "likes the lunch place", PUBLIC))
    assert human_shown(wc, DM).splitlines() == [
        "diagnosed with hypothyroidism",
        "works on the atlas project",
        "likes the lunch place",
    ]
    assert human_shown(wc, TEAM).splitlines() == ["works on the atlas project", "likes the lunch place"]
    for place in (PUBLIC, OTHER_PUBLIC, OTHER_TEAM):
        assert human_shown(wc, place) == "likes the lunch place"
        rendered = wc.render(place)
        assert "hypothyroidism" not in rendered and "atlas" not in rendered
        # The count is of what this place reads: nothing says more is kept elsewhere.
        assert f'<human chars="{len("likes the lunch place")}/200">' in rendered
    # The operator's persona is shown everywhere; the private block only in the DM.
    assert DEFAULT_PERSONA in wc.render(PUBLIC)
    assert f"<{PRIVATE_BLOCK}" in wc.render(DM) and f"<{PRIVATE_BLOCK}" not in wc.render(TEAM)


def test_a_channel_reads_the_placeholder_while_every_line_is_kept_elsewhere() -> None:
    wc = context()
    before = wc.render(PUBLIC)
    assert DEFAULT_HUMAN in before
    edit(wc, wc.append("human", "diagnosed with hypothyroidism", DM))
    assert DEFAULT_HUMAN not in wc.render(DM)
    assert wc.render(PUBLIC) == before, "a DM edit changes nothing a channel is shown"


def test_lines_record_their_place_time_and_a_stable_id() -> None:
    wc = context()
    block = edit(wc, wc.append("human", "first fact\nsecond fact", TEAM))
    assert [(line.text, line.place) for line in block.lines] == [("first fact", TEAM.key), ("second fact", TEAM.key)]
    assert len({line.id for line in block.lines}) == 2
    first = block.lines[0]
    edited = edit(wc, wc.replace("human", "first fact", "first fact, corrected", TEAM))
    assert edited.lines[0].id == first.id and edited.lines[0].written_at >= first.written_at
    assert edited.lines[1] == block.lines[1], "an untouched line is kept as it was"


def test_replace_touches_only_what_the_place_can_see() -> None:
    wc = context()
    edit(wc, wc.append("human", "code 1234 at home", DM))
    edit(wc, wc.append("human", "code 1234 at work", PUBLIC))
    edit(wc, wc.replace("human", "1234", "5678", PUBLIC))
    assert human_shown(wc, DM).splitlines() == ["code 1234 at home", "code 5678 at work"]
    with pytest.raises(MemoryEditError) as refused:
        wc.replace("human", "at home", "", PUBLIC)
    # Not found here: the same words whether or not a DM line holds them.
    assert "not found in block 'human' as shown here" in str(refused.value)
    with pytest.raises(MemoryEditError) as absent:
        wc.replace("human", "never written", "", PUBLIC)
    assert str(absent.value) == str(refused.value)


def test_an_edit_made_in_a_dm_is_a_dm_line() -> None:
    wc = context()
    edit(wc, wc.append("human", "likes tea", PUBLIC))
    edit(wc, wc.replace("human", "likes tea", "likes tea, but not since the diagnosis", DM))
    assert "diagnosis" not in wc.render(PUBLIC)
    assert [line.place for line in wc.get("human").lines] == [DM.key]


def test_replace_across_lines_and_deleting() -> None:
    wc = context()
    edit(wc, wc.append("human", "lives in Oslo", PUBLIC))
    edit(wc, wc.append("human", "secret line", DM))
    edit(wc, wc.append("human", "works at a bakery", PUBLIC))
    # Two lines next to each other as this channel reads them, with a DM line between them as stored.
    edit(wc, wc.replace("human", "Oslo\nworks", "Bergen and works", PUBLIC))
    assert human_shown(wc, DM).splitlines() == ["lives in Bergen and works at a bakery", "secret line"]
    edit(wc, wc.replace("human", "lives in Bergen and works at a bakery", "", PUBLIC))
    assert human_shown(wc, DM) == "secret line"
    assert human_shown(wc, PUBLIC) == DEFAULT_HUMAN


def test_the_limit_counts_the_whole_block_and_a_channel_refusal_tells_nothing_about_the_rest() -> None:
    wc = context(human_limit=60)
    edit(wc, wc.append("human", "x" * 40, DM))
    with pytest.raises(MemoryEditError) as refused:
        wc.append("human", "y" * 25, PUBLIC)
    text = str(refused.value)
    assert "no room" in text and "core_memory_replace" in text and "archival_memory_insert" in text
    assert set(re.findall(r"\d+", text)) == {"60"}, "only the limit, no count of what other places keep"
    with pytest.raises(MemoryEditError) as in_dm:
        wc.append("human", "y" * 25, DM)
    assert "would hold 66 characters" in str(in_dm.value) and "20 characters free" in str(in_dm.value)
    edit(wc, wc.append("human", "y" * 19, PUBLIC))  # what fits, fits
    assert len(wc.get("human").value) == 60


def test_the_private_block_is_for_dms_only() -> None:
    wc = context()
    for place in (PUBLIC, TEAM):
        with pytest.raises(MemoryEditError, match="only in a direct message"):
            wc.append(PRIVATE_BLOCK, "a confidence", place)
    edit(wc, wc.append(PRIVATE_BLOCK, "a confidence", DM))
    with pytest.raises(MemoryEditError, match="cannot be shared"):
        wc.replace(PRIVATE_BLOCK, "confidence", "confidence", DM, everywhere=True)
    with pytest.raises(MemoryEditError, match="cannot be shared"):
        wc.share_line(PRIVATE_BLOCK, wc.get(PRIVATE_BLOCK).lines[0].id)


def test_sharing_a_line() -> None:
    wc = context()
    edit(wc, wc.append("human", "grows tomatoes", DM))
    edit(wc, wc.append("human", "grows basil", DM))
    # A line replaced by itself everywhere is shared, as it was written (its id and place kept).
    before = wc.get("human").lines[0]
    edit(wc, wc.replace("human", "tomatoes", "tomatoes", DM, everywhere=True))
    after = wc.get("human").lines[0]
    assert (after.id, after.place, after.text, after.shared) == (before.id, DM.key, before.text, True)
    assert human_shown(wc, PUBLIC) == "grows tomatoes"
    # A channel cannot share what it cannot see (and is not told it exists).
    with pytest.raises(MemoryEditError, match="as shown here"):
        wc.replace("human", "basil", "basil", PUBLIC, everywhere=True)
    # A private channel's own line can be shared from there; a new line can be written everywhere.
    edit(wc, wc.append("human", "leads the team", TEAM))
    edit(wc, wc.replace("human", "leads the team", "leads the team since May", TEAM, everywhere=True))
    edit(wc, wc.append("human", "just got a new job", DM, everywhere=True))
    assert human_shown(wc, OTHER_PUBLIC).splitlines() == [
        "grows tomatoes",
        "leads the team since May",
        "just got a new job",
    ]
    with pytest.raises(MemoryEditError, match="cannot be shared"):
        wc.append(PRIVATE_BLOCK, "a confidence", DM, everywhere=True)


def test_share_and_forget_by_line_id() -> None:
    wc = context()
    block = edit(wc, wc.append("human", "a\nb", DM))
    first, second = block.lines
    edit(wc, wc.share_line("human", second.id))
    assert human_shown(wc, PUBLIC) == "b"
    with pytest.raises(MemoryEditError, match="No line"):
        wc.share_line("human", "nope")
    edit(wc, wc.without("human", [first.id]))
    assert human_shown(wc, DM) == "b"


def test_text_from_before_places_counts_as_written_in_the_dm() -> None:
    from memory.types import utc_now

    now = utc_now()
    assert {line.place for line in lines_from_before_places("likes tea\nhas a cat", now)} == {DM.key}
    assert [line.place for line in lines_from_before_places(DEFAULT_HUMAN, now)] == [OPERATOR_KEY]
    assert [line.place for line in lines_from_before_places(DEFAULT_PERSONA[:100], now)] == [OPERATOR_KEY]
    assert lines_from_before_places("", now) == []


def test_a_line_survives_its_record() -> None:
    line = BlockLine("grows tomatoes", TEAM.key, shared=True)
    assert BlockLine.from_record(line.record()) == line
    block = Block("human", limit=50, lines=[line])
    assert Block.lines_from_json(block.lines_json()) == [line]
