"""The inbox and the reply outbox (crash safety): recorded once,
replayed in order, confirmed, swept, scrubbed after a forget."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from memory.store import InboxEntry, OutboxEntry, Store
from memory.types import Message, utc_now
from memory.working_context import default_blocks


def entry(event_id: str, platform: str = "slack", key: str = "slack:T1:U1", **payload: object) -> InboxEntry:
    return InboxEntry(event_id, platform, key, {"text": f"payload of {event_id}", **payload}, utc_now())


def reply(event_id: str, n: int, key: str = "slack:T1:U1", platform: str = "slack") -> OutboxEntry:
    return OutboxEntry(
        f"{event_id}:{n}",
        event_id,
        n,
        key,
        platform,
        key.split(":", 1)[1],
        {"channel": "D1", "thread_ts": "1.2"},
        f"reply {n} to {event_id}",
        utc_now(),
    )


async def test_an_event_is_recorded_once_and_pending_until_done(store: Store) -> None:
    assert await store.inbox_receive(entry("Ev1", nested={"a": [1, "ü"]}))
    assert not await store.inbox_receive(entry("Ev1"))  # a repeat delivery
    pending = await store.inbox_pending("slack")
    assert [e.event_id for e in pending] == ["Ev1"]
    assert pending[0].payload == {"text": "payload of Ev1", "nested": {"a": [1, "ü"]}}
    assert pending[0].agent_key == "slack:T1:U1" and pending[0].state == "pending"
    await store.inbox_update("Ev1", attempts=2)
    assert (await store.inbox_pending("slack"))[0].attempts == 2
    await store.inbox_update("Ev1", state="done")
    assert await store.inbox_pending("slack") == []
    assert not await store.inbox_receive(entry("Ev1"))  # still recognised once done


async def test_a_start_says_never_started_only_the_first_time(store: Store) -> None:
    # A store that keeps the mark (MongoDB: it saves the append its read) says so once; SQLite
    # checks in the append's transaction and keeps none. Neither may say it of a later start.
    marks = store.serves_many_processes
    for event_id in ("EvStart", "EvFollower"):
        assert await store.inbox_receive(entry(event_id))
    await store.inbox_absorb("EvStart", ["EvFollower"])
    assert await store.inbox_start("EvStart", alone=True) is marks
    stored = await store.inbox_entry("EvStart")
    assert stored is not None and (stored.state, stored.alone) == ("running", True)
    assert not await store.inbox_start("EvStart", alone=False)  # running: a redo of the same run
    await store.inbox_update("EvStart", state="pending")  # taken over after a crash
    assert not await store.inbox_start("EvStart", alone=False)
    assert not await store.inbox_start("EvFollower", alone=False)  # its batch may have recorded it
    await store.inbox_update("EvStart", state="waiting")
    assert not await store.inbox_start("EvStart", alone=False)  # a waiting one stays waiting
    waiting = await store.inbox_entry("EvStart")
    assert waiting is not None and waiting.state == "waiting"


async def test_pending_events_come_back_in_arrival_order_per_origin(store: Store) -> None:
    ids = [f"Ev{n:03d}" for n in range(30)]
    for n, event_id in enumerate(ids):
        assert await store.inbox_receive(entry(event_id, platform="slack" if n % 3 else "discord"))
    await store.inbox_update(ids[4], state="done")
    slack = [e.event_id for e in await store.inbox_pending("slack")]
    assert slack == [i for n, i in enumerate(ids) if n % 3 and n != 4]
    assert [e.event_id for e in await store.inbox_pending("discord")] == ids[::3]


async def test_concurrent_deliveries_record_exactly_once(store: Store, twin: Store) -> None:
    for n in range(8):
        results = await asyncio.gather(*(s.inbox_receive(entry(f"race{n}")) for s in (store, twin) * 4))
        assert sorted(results) == [False] * 7 + [True]


async def test_outbox_records_each_reply_once_until_confirmed(store: Store) -> None:
    assert await store.outbox_add(reply("Ev1", 0))
    assert await store.outbox_add(reply("Ev1", 1))
    assert not await store.outbox_add(reply("Ev1", 0))  # a redone send
    assert await store.outbox_add(reply("Ev2", 0, key="slack:T1:U2"))
    replies = await store.outbox_for_event("Ev1")
    assert [(r.id, r.position, r.text) for r in replies] == [
        ("Ev1:0", 0, "reply 0 to Ev1"),
        ("Ev1:1", 1, "reply 1 to Ev1"),
    ]
    assert replies[0].reply_to == {"channel": "D1", "thread_ts": "1.2"} and replies[0].user_id == "T1:U1"
    assert [r.id for r in await store.outbox_pending("slack")] == ["Ev1:0", "Ev1:1", "Ev2:0"]
    await store.outbox_update("Ev1:0", state="sent")
    await store.outbox_update("Ev2:0", state="dropped")
    await store.outbox_update("Ev1:1", state="pending", attempts=1, next_try_at=1_000.0)
    assert [r.id for r in await store.outbox_pending("slack")] == ["Ev1:1"]
    assert await store.outbox_pending("slack", due_by=999.0) == []
    due = await store.outbox_pending("slack", due_by=1_000.0)
    assert [(r.id, r.attempts, r.next_try_at) for r in due] == [("Ev1:1", 1, 1_000.0)]
    assert await store.outbox_pending("discord") == []
    assert [r.state for r in await store.outbox_for_event("Ev1")] == ["sent", "pending"]


async def scrubbed_fixture(store: Store) -> None:
    """UA: a finished event with a sent and a dropped reply, one running with a
    pending reply, one waiting; UB: a finished event with a sent reply."""
    for event_id, key in (("EvDone", "slack:T1:UA"), ("EvRun", "slack:T1:UA"), ("EvWait", "slack:T1:UA")):
        assert await store.inbox_receive(entry(event_id, key=key))
    assert await store.inbox_receive(entry("EvB", key="slack:T1:UB"))
    for reply_entry in (reply("EvDone", 0, key="slack:T1:UA"), reply("EvDone", 1, key="slack:T1:UA")):
        await store.outbox_add(reply_entry)
    await store.outbox_add(reply("EvRun", 0, key="slack:T1:UA"))
    await store.outbox_add(reply("EvB", 0, key="slack:T1:UB"))
    await store.outbox_update("EvDone:0", state="sent")
    await store.outbox_update("EvDone:1", state="dropped")
    await store.outbox_update("EvB:0", state="sent")
    await store.inbox_update("EvDone", state="done")
    await store.inbox_update("EvB", state="done")
    await store.inbox_update("EvRun", state="running")
    await store.inbox_update("EvWait", state="waiting", next_try_at=5.0)


async def test_scrub_empties_a_users_finished_events_and_keeps_what_crash_safety_needs(store: Store) -> None:
    await scrubbed_fixture(store)
    await store.inbox_scrub("slack:T1:UA")
    done = await store.inbox_entry("EvDone")
    assert done is not None and done.payload == {} and done.state == "done" and done.agent_key == "slack:T1:UA"
    assert [(r.state, r.text) for r in await store.outbox_for_event("EvDone")] == [("sent", ""), ("dropped", "")]
    # Unfinished events are replayed from their payload, a pending reply is sent as it is.
    assert [(e.event_id, e.payload) for e in await store.inbox_pending("slack")] == [
        ("EvRun", {"text": "payload of EvRun"}),
        ("EvWait", {"text": "payload of EvWait"}),
    ]
    assert [(r.id, r.text) for r in await store.outbox_pending("slack")] == [("EvRun:0", "reply 0 to EvRun")]
    # Another user's are untouched; a repeat delivery of the scrubbed one is still dropped.
    other = await store.inbox_entry("EvB")
    assert other is not None and other.payload == {"text": "payload of EvB"}
    assert [r.text for r in await store.outbox_for_event("EvB")] == ["reply 0 to EvB"]
    assert not await store.inbox_receive(entry("EvDone", key="slack:T1:UA"))


async def test_scrub_of_a_user_forgotten_whole_finishes_their_events_and_names_nobody(store: Store) -> None:
    await scrubbed_fixture(store)
    forgotten_at = utc_now()
    await asyncio.sleep(0.01)
    assert await store.inbox_receive(entry("EvLater", key="slack:T1:UA"))  # sent while the forget waited
    await store.outbox_add(reply("EvLater", 0, key="slack:T1:UA"))
    await store.inbox_scrub("slack:T1:UA", forgotten_at=forgotten_at)
    for event_id in ("EvDone", "EvRun", "EvWait"):
        row = await store.inbox_entry(event_id)
        assert row is not None and (row.state, row.payload, row.agent_key) == ("done", {}, "")
        assert not await store.inbox_receive(entry(event_id, key="slack:T1:UA"))  # still dropped
        for scrubbed in await store.outbox_for_event(event_id):
            assert (scrubbed.text, scrubbed.user_id, scrubbed.reply_to, scrubbed.agent_key) == ("", "", {}, "")
            assert scrubbed.state in ("sent", "dropped")  # the pending one is never sent
    # What came after the forget is a new event of theirs, whole; the other user's are untouched.
    assert [(e.event_id, e.payload) for e in await store.inbox_pending("slack")] == [
        ("EvLater", {"text": "payload of EvLater"})
    ]
    assert [(r.id, r.text) for r in await store.outbox_pending("slack")] == [("EvLater:0", "reply 0 to EvLater")]
    other = await store.inbox_entry("EvB")
    assert other is not None and other.payload == {"text": "payload of EvB"} and other.agent_key == "slack:T1:UB"
    assert [r.text for r in await store.outbox_for_event("EvB")] == ["reply 0 to EvB"]


async def test_the_message_of_an_event_is_found_by_its_id(store: Store) -> None:
    record, _ = await store.get_or_create_agent("slack:T1:U1", default_blocks(100, 100))
    other, _ = await store.get_or_create_agent("slack:T1:U2", default_blocks(100, 100))
    await store.append_messages(record.id, [Message(role="user", content="first", event_id="Ev1")])
    await store.append_messages(
        record.id, [Message(role="assistant", content="a"), Message(role="user", content="second", event_id="Ev2")]
    )
    assert await store.event_message_seq(record.id, "Ev1") == 1
    assert await store.event_message_seq(record.id, "Ev2") == 3
    assert await store.event_message_seq(record.id, "Ev3") is None
    assert await store.event_message_seq(other.id, "Ev1") is None  # never across agents


async def test_an_event_message_is_appended_once(store: Store) -> None:
    record, _ = await store.get_or_create_agent("slack:T1:U1", default_blocks(100, 100))
    other, _ = await store.get_or_create_agent("slack:T1:U2", default_blocks(100, 100))
    first = await store.append_messages(
        record.id, [Message(role="user", content="hi", event_id="Ev1")], unless_event="Ev1"
    )
    assert [m.seq for m in first] == [1]
    # A redo of Ev1 stores nothing; another agent's Ev1 is another event.
    again = [
        Message(role="user", content="hi", event_id="Ev1"),
        Message(role="user", content="follower", event_id="Ev9"),
    ]
    assert await store.append_messages(record.id, again, unless_event="Ev1") == []
    assert again[0].seq == 0 and await store.count_messages(record.id) == 1
    assert await store.event_message_seq(record.id, "Ev9") is None
    assert [m.seq for m in await store.append_messages(other.id, again, unless_event="Ev1")] == [1, 2]


async def test_appends_follow_the_newest_message_whatever_another_process_did(store: Store, twin: Store) -> None:
    """A store may remember the newest message it saw (MongoDB reads from there on):
    another process's appends, and forgetting that very message, must not fool it."""
    record, _ = await store.get_or_create_agent("slack:T1:U1", default_blocks(100, 100))

    def said(text: str, event_id: str | None = None) -> list[Message]:
        return [Message(role="user", content=text, event_id=event_id)]

    seen = await store.append_messages(record.id, said("one", "Ev1") + said("two"), unless_event="Ev1")
    await twin.append_messages(record.id, said("three", "Ev3"), unless_event="Ev3")
    await twin.delete_messages(record.id, [seen[-1].seq])
    assert await store.append_messages(record.id, said("three again", "Ev3"), unless_event="Ev3") == []
    assert len(await store.append_messages(record.id, said("four", "Ev4"), unless_event="Ev4")) == 1
    assert [m.content for m in await store.messages_since(record.id, 0)] == ["one", "three", "four"]
    # Every message from the one it saw last on forgotten: the newest is read again.
    later = [m.seq for m in await store.messages_since(record.id, 0)][1:]
    await twin.delete_messages(record.id, later)
    [five] = await store.append_messages(record.id, said("five", "Ev5"), unless_event="Ev5")
    assert [m.content for m in await store.messages_since(record.id, 0)] == ["one", "five"]
    assert five.seq > seen[0].seq
    assert await store.append_messages(record.id, said("one again", "Ev1"), unless_event="Ev1") == []
    assert await store.count_messages(record.id) == 2


async def test_a_stale_newest_seq_from_the_caller_costs_a_read_never_a_seq(store: Store, twin: Store) -> None:
    """`after` spares a read only while it is true: another process's append in
    between (which the lease prevents) is still found, by the unique seq."""
    record, _ = await store.get_or_create_agent("slack:T1:U1", default_blocks(100, 100))
    [one] = await store.append_messages(record.id, [Message(role="user", content="one")])
    [two] = await store.append_messages(record.id, [Message(role="user", content="two")], after=one.seq)
    assert two.seq == one.seq + 1
    await twin.append_messages(record.id, [Message(role="user", content="three")])
    [four] = await store.append_messages(record.id, [Message(role="user", content="four")], after=two.seq)
    [five] = await store.append_messages(record.id, [Message(role="user", content="five")], after=one.seq)
    assert [m.content for m in await store.messages_since(record.id, 0)] == ["one", "two", "three", "four", "five"]
    assert [m.seq for m in await store.messages_since(record.id, 0)] == [1, 2, 3, 4, 5]
    assert (four.seq, five.seq) == (4, 5)


async def test_finished_entries_older_than_a_day_are_swept(store: Store) -> None:
    old = entry("EvOld")
    old.received_at = utc_now() - timedelta(days=2)
    assert await store.inbox_receive(old)
    await store.inbox_update("EvOld", state="done")
    stale = reply("EvOld", 0)
    stale.created_at = old.received_at
    await store.outbox_add(stale)
    await store.outbox_update("EvOld:0", state="sent")
    unsent = reply("EvOld", 1)
    unsent.created_at = old.received_at
    await store.outbox_add(unsent)
    store._last_inbox_sweep = 0.0  # type: ignore[attr-defined]  # due now
    assert await store.inbox_receive(entry("EvNew"))
    assert [r.id for r in await store.outbox_for_event("EvOld")] == ["EvOld:1"]  # never an unsent one
    assert await store.inbox_receive(entry("EvOld"))  # swept: new again


async def test_debounced_entries_name_the_entry_they_were_absorbed_into(store: Store, twin: Store) -> None:
    for event_id in ("Lead", "Follow1", "Follow2", "Alone"):
        assert await store.inbox_receive(entry(event_id))
    await store.inbox_absorb("Lead", ["Follow1", "Follow2"])
    await store.inbox_absorb("Lead", [])  # nothing to link: no error
    pending = {e.event_id: e.absorbed_into for e in await twin.inbox_pending("slack")}
    assert pending == {"Lead": "", "Follow1": "Lead", "Follow2": "Lead", "Alone": ""}
    # The link survives the state changes of a replay, and shows on waiting entries too.
    await store.inbox_update("Follow1", state="waiting", next_try_at=1.0)
    assert [(e.event_id, e.absorbed_into) for e in await store.inbox_pending("slack", due_by=2.0)] == [
        ("Follow1", "Lead")
    ]
    # "" unlinks: a follower its batch never recorded is an event of its own again.
    await store.inbox_absorb("", ["Follow2"])
    pending = {e.event_id: e.absorbed_into for e in await twin.inbox_pending("slack")}
    assert pending == {"Lead": "", "Follow1": "Lead", "Follow2": "", "Alone": ""}


async def test_an_entry_names_its_owner_and_one_process_takes_it_over(store: Store, twin: Store) -> None:
    received = entry("EvO1")
    received.owner = "host:1:aa/inbox-1"
    assert await store.inbox_receive(received)
    [found] = await twin.inbox_pending("slack")
    assert (found.owner, found.alone) == ("host:1:aa/inbox-1", False)
    # Six processes try to take the dead owner's entry over at once: one does.
    takers = [f"host:{n}:bb/inbox-1" for n in range(2, 8)]
    stores = (store, twin) * 3
    won = await asyncio.gather(
        *(s.inbox_claim("EvO1", "host:1:aa/inbox-1", taker) for s, taker in zip(stores, takers, strict=True))
    )
    assert won.count(True) == 1
    [found] = await store.inbox_pending("slack")
    assert found.owner == takers[won.index(True)]
    # Taking it over from an owner that no longer holds it changes nothing.
    assert not await twin.inbox_claim("EvO1", "host:1:aa/inbox-1", "host:9:cc/inbox-1")
    assert (await store.inbox_pending("slack"))[0].owner == takers[won.index(True)]


async def test_the_alone_mark_is_set_and_cleared(store: Store) -> None:
    assert await store.inbox_receive(entry("EvA1"))
    assert await store.inbox_update("EvA1", state="running", alone=True, only_from=("pending",))
    [found] = await store.inbox_pending("slack")
    assert (found.state, found.alone) == ("running", True)
    await store.inbox_update("EvA1", alone=False)
    assert (await store.inbox_pending("slack"))[0].alone is False


async def test_a_steps_replies_are_stored_with_its_messages_in_one_call(store: Store) -> None:
    """bot/agent.py hands a step's replies to append_messages: they are in the
    outbox once the call returns, the messages recorded after them; alone too
    (no messages), and a redone step's reply is not stored twice."""
    record, _ = await store.get_or_create_agent("slack:T1:U1", default_blocks(100, 100))
    step = [Message(role="assistant", content="calling send_message"), Message(role="tool", content="OK")]
    stored = await store.append_messages(record.id, step, replies=[reply("Ev1", 0)])
    assert [m.seq for m in stored] == [1, 2]
    assert [r.id for r in await store.outbox_for_event("Ev1")] == ["Ev1:0"]
    assert await store.append_messages(record.id, [], replies=[reply("Ev1", 1), reply("Ev1", 0)]) == []
    assert [(r.id, r.text) for r in await store.outbox_pending("slack")] == [
        ("Ev1:0", "reply 0 to Ev1"),
        ("Ev1:1", "reply 1 to Ev1"),
    ]
    assert [m.content for m in await store.messages_since(record.id, 0)] == ["calling send_message", "OK"]
