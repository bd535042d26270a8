"""The slash commands' neutral layer (bot/commands/): what a line of text
parses into, and what each command answers, with a stand-in command port.
The platforms' rendering of these answers is tested with each adapter."""

from __future__ import annotations

from typing import Any

import pytest

from bot.commands.catalog import COMMANDS, FORGET_FAILED, FORGET_QUESTION, MEMORY_FAILED, NOTHING_HELD, press, run
from bot.commands.model import Caller
from bot.forgetting.erasing import Receipt
from bot.forgetting.ledger import Item, LedgerPage, UnknownItem
from bot.forgetting.matching import Found
from memory.places import DM_KEY
from memory.types import Passage

ALICE = Caller("slack", "T1:U1", {"dm_user": "U1"})


class Port:
    """A command port holding one note and one count; it records what it was asked."""

    def __init__(self, *, failing: bool = False) -> None:
        self.failing = failing
        self.calls: list[tuple[str, ...]] = []

    async def ledger(self, key: str, page: int = 1) -> LedgerPage | None:
        self.calls.append(("ledger", key, str(page)))
        if self.failing:
            raise RuntimeError("store down")
        items = [Item("note:7", "note", "Loves jazz.", DM_KEY, None), Item("", "messages", "3 messages", DM_KEY, None)]
        return LedgerPage(items, page, 2, 12)

    async def forget_one(self, key: str, item_id: str) -> Receipt:
        self.calls.append(("forget", key, item_id))
        if self.failing:
            raise RuntimeError("store down")
        if item_id != "note:7":
            raise UnknownItem(f"No item {item_id!r}.")
        return Receipt(notes=1)

    async def share_note(self, key: str, item_id: str) -> str:
        self.calls.append(("share", key, item_id))
        return f"Shared: {item_id}"

    async def search_memory(self, key: str, query: str) -> str:
        self.calls.append(("search", key, query))
        return f"Best matches for {query!r}"

    async def preview_forget(self, key: str, about: str) -> Found:
        self.calls.append(("preview", key, about))
        found = Found(about)
        if about != "nothing":
            found.passages.append(Passage(f"My {about} number.", id=1))
        return found

    async def forget_topic(self, key: str, about: str) -> Receipt:
        self.calls.append(("forget about", key, about))
        return Receipt(passages=1)

    async def channel_setting(self, key: str, choice: str = "") -> str:
        self.calls.append(("channels", key, choice))
        return f"channels {choice or 'shown'}"

    async def forget(self, key: str) -> bool:
        self.calls.append(("forget everything", key))
        return True

    async def checkin_command(self, platform: str, user_id: str, text: str, reply_to: dict[str, Any]) -> str:
        self.calls.append(("checkin", platform, user_id, text, str(reply_to)))
        return f"checkin {text}"


@pytest.mark.parametrize(
    ("name", "text", "args"),
    [
        ("memory", "", {}),
        ("memory", "page 2", {"page": 2}),
        ("memory", "page two", {}),  # not a page number: the first page
        ("memory", "forget note:7", {"forget": "note:7"}),
        ("memory", "search", {"search": ""}),
        ("memory", "Search  jazz and blues ", {"search": "jazz and blues"}),
        ("memory", "jazz", {}),
        ("memory", "channels off", {"channels": "off"}),
        ("memory", "channels: on", {"channels": "on"}),
        ("memory", "channels", {"channels": ""}),
        ("forget", "", {}),
        ("forget", "about: my diagnosis", {"about": "my diagnosis"}),
        ("forget", "about:passport", {"about": "passport"}),
        ("forget", "my diagnosis", {"about": "my diagnosis"}),
        ("checkin", " daily 09:00 water the plants ", {"command": "daily 09:00 water the plants"}),
    ],
)
def test_a_line_of_text_names_an_option_or_fills_the_rest(name: str, text: str, args: dict[str, Any]) -> None:
    assert COMMANDS[name].parse(text) == args


async def test_memory_lists_the_page_with_a_button_per_item_that_can_be_forgotten_or_shared() -> None:
    port = Port()
    answer = await run(port, "memory", ALICE, {"page": 2})
    assert port.calls == [("ledger", "slack:T1:U1", "2")]
    assert answer.text == "What I hold on you: 12 items, page 2 of 2."
    note, count = answer.entries
    assert note.text.startswith("11. Note: Loves jazz.") and count.text.startswith("12. Messages: 3 messages")
    assert [(b.action, b.value, b.label, b.numbered) for b in note.buttons] == [
        ("forget_item", "note:7", "Forget this", "Forget 11"),
        ("share_item", "note:7", "Share everywhere", "Share 11"),
    ]
    assert count.buttons == ()  # a count is not forgotten one by one
    assert answer.footer.startswith("Forget one item: /memory forget <id>.")
    assert answer.whole == "\n".join([answer.text, note.text, count.text, "", answer.footer])


async def test_memory_verbs_reach_the_same_work_as_the_buttons() -> None:
    port = Port()
    forgotten = (await run(port, "memory", ALICE, {"forget": " note:7 "})).text
    assert forgotten.startswith("Forgotten: ") and "1 note" in forgotten
    assert (await press(port, "forget_item", ALICE, "note:7")).text == forgotten
    assert (await press(port, "forget_item", ALICE, "note:8")).text == "No item 'note:8'."
    assert (await run(port, "memory", ALICE, {"share": "note:7"})).text == "Shared: note:7"
    assert (await run(port, "memory", ALICE, {"search": "jazz"})).text == "Best matches for 'jazz'"


async def test_forget_asks_first_and_only_a_press_deletes() -> None:
    port = Port()
    question = await run(port, "forget", ALICE, {})
    assert question.text == FORGET_QUESTION and question.expires and port.calls == []
    assert [b.action for b in question.buttons] == ["forget_confirm", "forget_cancel"]
    assert (await press(port, "forget_cancel", ALICE, "")).text == "Cancelled: nothing was deleted."
    assert port.calls == []
    assert (await press(port, "forget_confirm", ALICE, "")).text.startswith("Done: I have forgotten everything")
    assert port.calls == [("forget everything", "slack:T1:U1")]


async def test_forget_about_shows_what_matches_and_its_button_carries_the_topic() -> None:
    port = Port()
    assert (await run(port, "forget", ALICE, {"about": "nothing"})).text == "I hold nothing about 'nothing'."
    question = await run(port, "forget", ALICE, {"about": "passport"})
    assert question.text.startswith("About 'passport' I hold ") and "My passport number." in question.text
    assert question.buttons[0].value == "passport"
    assert "1 saved passage" in (await press(port, "forget_about", ALICE, "passport")).text


async def test_checkin_defaults_to_help_and_goes_to_the_callers_dm() -> None:
    port = Port()
    assert (await run(port, "checkin", ALICE, {})).text == "checkin help"
    assert port.calls == [("checkin", "slack", "T1:U1", "help", "{'dm_user': 'U1'}")]


async def test_a_failure_is_logged_and_answered_with_the_commands_apology(caplog: pytest.LogCaptureFixture) -> None:
    port = Port(failing=True)
    assert (await run(port, "memory", ALICE, {})).text == MEMORY_FAILED
    assert (await press(port, "forget_item", ALICE, "note:7")).text == FORGET_FAILED
    assert "/memory failed for T1:U1" in caplog.text and "forget_item button failed" in caplog.text


async def test_nothing_held_says_so() -> None:
    class Empty(Port):
        async def ledger(self, key: str, page: int = 1) -> LedgerPage | None:
            return None

    assert (await run(Empty(), "memory", ALICE, {})).text == NOTHING_HELD


async def test_memory_channels_sets_or_shows_the_callers_choice() -> None:
    port = Port()
    assert (await run(port, "memory", ALICE, {"channels": "off"})).text == "channels off"
    assert (await run(port, "memory", ALICE, {"channels": "on"})).text == "channels on"
    # Shown when given alone (Slack) or as "show" (Discord drops an empty option).
    assert (await run(port, "memory", ALICE, {"channels": ""})).text == "channels shown"
    assert (await run(port, "memory", ALICE, {"channels": " Show "})).text == "channels shown"
    assert port.calls == [("channels", "slack:T1:U1", choice) for choice in ("off", "on", "", "")]
