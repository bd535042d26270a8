"""Copy everything from one store to another (SQLite <-> MongoDB, either way).

    memgpt-bot migrate --from sqlite:data/memgpt.sqlite3 --to mongodb://db1,db2/memgpt?replicaSet=rs0

Per agent: its blocks (with their times), summary and queue start, every
message in seq order (same fields and timestamps), every passage with its
embedding (and its content hash, so a later re-load of the same file still
skips what is held), the files recorded as loaded; then the shared
collections ("sources") and who they are attached to; then every check-in
and reminder, each user's time zone and quiet hours, the users exempt
from the usage limits, and each person's choice about channel memory (a
channel's memory is an agent keyed `channel:...`, copied as any other, its
lines with their speakers and message ids). Each agent, and each of those, is then read back from
the target and compared with the source. (Usage counters are not copied: they
only count the current minute and day.) A missing SQLite source is an error:
migrate never creates its source.

Only through the Store interface, so the target assigns new ids: agent ids,
passage ids, and message seqs 1..N (equal to the source's when the source has
no gaps; a MongoDB history with a crash gap is renumbered and the queue start
follows). An agent whose key already exists in the target is not touched and
is reported: migrate into an empty store (or forget those agents there first).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from collections.abc import Sequence
from dataclasses import astuple, dataclass, field, replace
from datetime import datetime
from pathlib import Path

from tqdm import tqdm

from memory.backends import StoreURL, StoreURLError, open_store, parse_store_url
from memory.ingest.reading import passage_hash
from memory.schedules import Schedule
from memory.store import SOURCE_KEY_PREFIX, Store, StoreError
from memory.types import AgentRecord, ConversationRecord, Message, Passage, utc_now

MESSAGE_BATCH = 500  # messages per append (one transaction each)
PASSAGE_BATCH = 256


class MigrationError(StoreError):
    """A bad store spec, or source and target being the same store."""


@dataclass(slots=True)
class AgentReport:
    key: str
    source_id: str
    target_id: str = ""
    blocks: int = 0
    messages: int = 0
    passages: int = 0
    documents: int = 0
    status: str = "copied"  # "copied", "skipped" (already in the target) or "mismatch"
    problems: list[str] = field(default_factory=list)


@dataclass(slots=True)
class MigrationReport:
    source: str
    target: str
    agents: list[AgentReport] = field(default_factory=list)
    sources: int = 0
    schedules: int = 0
    prefs: int = 0
    exemptions: int = 0
    consents: int = 0  # channel memory choices
    problems: list[str] = field(default_factory=list)  # not tied to one agent

    @property
    def ok(self) -> bool:
        return not self.problems and all(agent.status == "copied" for agent in self.agents)

    def summary(self) -> str:
        copied = [a for a in self.agents if a.status == "copied"]
        lines = [
            f"{self.source} -> {self.target}: {len(copied)} of {len(self.agents)} agents copied "
            f"({sum(a.messages for a in copied)} messages, {sum(a.passages for a in copied)} passages, "
            f"{sum(a.documents for a in copied)} loaded files), {self.sources} shared collections, "
            f"{self.schedules} check-ins and reminders, {self.prefs} users' time zone and quiet hours, "
            f"{self.exemptions} exemptions from the usage limits, {self.consents} channel memory choices"
        ]
        for agent in self.agents:
            if agent.status != "copied":
                lines.append(f"  {agent.key}: {agent.status}: {'; '.join(agent.problems)}")
        lines.extend(f"  {problem}" for problem in self.problems)
        lines.append("verified: every copied agent matches its source" if self.ok else "NOT everything was copied")
        return "\n".join(lines)


# -- store specs (memory/backends.py) ---------------------------------------------
def parse_spec(spec: str) -> StoreURL:
    """The backend and place a --from/--to spec names."""
    try:
        return parse_store_url(spec)
    except StoreURLError as error:
        raise MigrationError(str(error)) from None


# -- migrate ---------------------------------------------------------------------
async def migrate(source: Store, target: Store, progress: bool = True) -> MigrationReport:
    """Copy every agent, collection and loaded-file record from `source` to
    `target` (both open), then verify each agent. See the module docstring."""
    report = MigrationReport(_name(source), _name(target))
    agents = await source.list_agents()
    sizes = {a.id: await source.count_messages(a.id) + await source.count_passages(a.id) for a in agents}
    new_ids: dict[str, str] = {}
    with tqdm(
        total=sum(sizes.values()) + len(agents), unit="item", desc="migrate", file=sys.stderr, disable=not progress
    ) as bar:
        for agent in agents:
            bar.set_postfix_str(agent.key, refresh=False)
            agent_report = await _copy_agent(source, target, agent, bar)
            report.agents.append(agent_report)
            if agent_report.status != "skipped":
                new_ids[agent.id] = agent_report.target_id
            bar.update(1)
    await _copy_sources(source, target, agents, new_ids, report)
    await _copy_user_settings(source, target, [a.key for a in agents], report)
    return report


async def _copy_user_settings(source: Store, target: Store, keys: list[str], report: MigrationReport) -> None:
    """Check-ins and reminders (same ids, so `/checkin remove ID` still works),
    time zones and quiet hours, exemptions; then each is compared."""
    source_schedules, target_schedules = source.schedules, target.schedules
    taken = {schedule.id for schedule in await target_schedules.list_all()}
    schedules = await source_schedules.list_all()
    for schedule in schedules:
        if schedule.id in taken:
            report.problems.append(f"check-in {schedule.id} of {schedule.agent_key}: the target has one with its id")
            continue
        # Unclaimed: the process that last fired it does not serve the target.
        await target_schedules.add(replace(schedule, claimed_by=None))
        report.schedules += 1
    copied = {schedule.id: schedule for schedule in await target_schedules.list_all()}
    for schedule in schedules:
        if schedule.id not in taken and _schedule_fields(copied.get(schedule.id)) != _schedule_fields(schedule):
            report.problems.append(f"check-in {schedule.id} of {schedule.agent_key} differs in the target")

    # Preferences live by user, with or without an agent or a schedule.
    for key in dict.fromkeys([*keys, *(schedule.agent_key for schedule in schedules)]):
        prefs = await source_schedules.get_prefs(key)
        if (prefs.timezone, prefs.quiet_start, prefs.quiet_end) == (None, None, None):
            continue
        await target_schedules.save_prefs(prefs)
        report.prefs += 1
        if await target_schedules.get_prefs(key) != prefs:
            report.problems.append(f"time zone or quiet hours of {key} differ in the target")

    exempt = await source.list_usage_exempt()
    for key in exempt:
        await target.set_usage_exempt(key, True, utc_now())
        report.exemptions += 1
    missing = set(exempt) - set(await target.list_usage_exempt())
    if missing:
        report.problems.append(f"exemptions from the usage limits missing in the target: {', '.join(sorted(missing))}")

    # Who let channels keep what they say, or not (memory/channels.py), by speaker.
    choices = await source.list_channel_consent()
    for speaker, keep, at in choices:
        await target.set_channel_consent(speaker, keep, at)
        report.consents += 1
    in_target = {speaker: (keep, at) for speaker, keep, at in await target.list_channel_consent()}
    for speaker, keep, at in choices:
        held = in_target.get(speaker)
        # Times to the millisecond: SQLite keeps float seconds, MongoDB microseconds.
        if held is None or held[0] != keep or abs((held[1] - at).total_seconds()) > 0.001:
            report.problems.append(f"the channel memory choice of {speaker} differs in the target")


def _schedule_fields(schedule: Schedule | None) -> tuple[object, ...] | None:
    return None if schedule is None else astuple(replace(schedule, claimed_by=None))


def _name(store: Store) -> str:
    path = getattr(store, "path", None)
    return f"sqlite:{path}" if path is not None else repr(store)


async def _copy_agent(source: Store, target: Store, agent: AgentRecord, bar: tqdm) -> AgentReport:
    result = AgentReport(agent.key, agent.id)
    existing = await target.find_agent(agent.key)
    if existing is not None:
        result.status, result.target_id = "skipped", existing.id
        result.problems.append(f"already in the target (agent {existing.id}); left as it is")
        bar.update(await source.count_messages(agent.id) + await source.count_passages(agent.id))
        return result
    blocks = await source.load_blocks(agent.id)
    copy, _ = await target.get_or_create_agent(agent.key, blocks)
    result.target_id = copy.id
    for block in blocks:  # again, for their own updated_at times
        await target.save_block(copy.id, block)

    messages = await source.messages_since(agent.id, 0)
    new_seq: dict[int, int] = {}
    for start in range(0, len(messages), MESSAGE_BATCH):
        originals = messages[start : start + MESSAGE_BATCH]
        copies = await target.append_messages(copy.id, [_clone_message(m) for m in originals])
        for old, new in zip(originals, copies, strict=True):
            new_seq[old.seq] = new.seq
        bar.update(len(originals))
    for conversation in await source.list_conversations(agent.id):
        await _copy_conversation(target, copy.id, conversation, messages, new_seq, agent.created_at)

    passages = await _all_passages(source, agent.id)
    hashes = [passage_hash(p.text) for p in passages]
    known = await source.known_passage_hashes(agent.id, hashes) if passages else set()
    # A hash the source holds goes with the first passage of that text (the
    # one the loader stored); the others are plain passages. Runs of one kind
    # are stored in source order, so list_passages orders them alike.
    run: list[Passage] = []
    run_hashes: list[str] | None = None
    for passage, content_hash in zip(passages, hashes, strict=True):
        hashed = content_hash in known
        known.discard(content_hash)
        if run and (len(run) >= PASSAGE_BATCH or hashed != (run_hashes is not None)):
            await _store_run(target, copy.id, run, run_hashes, bar)
            run, run_hashes = [], None
        run.append(_clone_passage(passage))
        if hashed:
            run_hashes = [*(run_hashes or []), content_hash]
    if run:
        await _store_run(target, copy.id, run, run_hashes, bar)

    documents = await source.list_documents(agent.id)
    for document in documents:
        await target.record_document(copy.id, document)

    result.blocks, result.messages = len(blocks), len(messages)
    result.passages, result.documents = len(passages), len(documents)
    result.problems.extend(await _verify(source, target, agent, copy.id, messages, passages))
    if result.problems:
        result.status = "mismatch"
    return result


async def _copy_sources(
    source: Store, target: Store, agents: Sequence[AgentRecord], new_ids: dict[str, str], report: MigrationReport
) -> None:
    """Collections after agents: their records, attach-to-all flags, single
    attachments, and detaches that override attach-to-all."""
    members = [a for a in agents if not a.key.startswith(SOURCE_KEY_PREFIX) and a.id in new_ids]
    for record in await source.list_sources():
        if record.id not in new_ids:
            report.problems.append(f"collection {record.name!r} was not copied (its agent record was skipped)")
            continue
        copy, _ = await target.create_source(record.name)
        if copy.id != new_ids[record.id]:
            report.problems.append(f"collection {record.name!r}: the target keeps it under another record")
            continue
        report.sources += 1
        if record.attach_all:
            await target.attach_source(copy.id, None)
        for agent_id in await source.source_attachments(record.id):
            if agent_id in new_ids:
                await target.attach_source(copy.id, new_ids[agent_id])
        for agent in members:
            sees = record.id in {s.id for s in await source.attached_sources(agent.id)}
            if sees != (copy.id in {s.id for s in await target.attached_sources(new_ids[agent.id])}):
                if sees:
                    await target.attach_source(copy.id, new_ids[agent.id])
                else:
                    await target.detach_source(copy.id, new_ids[agent.id])


async def _store_run(
    target: Store, agent_id: str, passages: list[Passage], hashes: list[str] | None, bar: tqdm
) -> None:
    if hashes is None:
        await target.insert_passages(agent_id, passages)
    else:
        await target.insert_hashed_passages(agent_id, passages, hashes)
    bar.update(len(passages))


async def _all_passages(store: Store, agent_id: str) -> list[Passage]:
    passages: list[Passage] = []
    while page := await store.list_passages(agent_id, PASSAGE_BATCH, len(passages)):
        passages.extend(page)
    return passages


async def _copy_conversation(
    target: Store,
    copy_id: str,
    conversation: ConversationRecord,
    messages: list[Message],
    new_seq: dict[int, int],
    created_at: datetime,
) -> None:
    """One place's conversation: its name, summary and queue start (mapped to
    the copy's seqs: the first of the place's queue messages, or past the end)."""
    await target.get_conversation(copy_id, conversation.place, conversation.name)
    untouched = conversation.queue_start_seq == 1 and conversation.summary_updated_at is None
    if conversation.summary or not untouched:
        start = conversation.queue_start_seq
        queued = (new_seq[m.seq] for m in messages if m.seq >= start and m.place == conversation.place)
        start_seq = next(queued, len(messages) + 1)
        when = conversation.summary_updated_at or created_at
        await target.update_queue(copy_id, conversation.summary, start_seq, when, place=conversation.place)


def _clone_message(m: Message) -> Message:
    # The event id too: a redone event (or a channel line re-delivered) is still recognised.
    return Message(
        m.role,
        m.content,
        m.tool_calls,
        m.tool_call_id,
        m.name,
        m.created_at,
        event_id=m.event_id,
        place=m.place,
        speaker=m.speaker,
        speaker_name=m.speaker_name,
        edited_at=m.edited_at,
    )


def _clone_passage(p: Passage) -> Passage:
    embedding = None if p.embedding is None else list(p.embedding)
    return Passage(
        p.text, source=p.source, position=p.position, created_at=p.created_at, embedding=embedding, place=p.place
    )


def _message_fields(m: Message) -> tuple[object, ...]:
    fields = (m.role, m.content, m.tool_calls, m.tool_call_id, m.name, m.created_at, m.event_id, m.place)
    return (*fields, m.speaker, m.speaker_name, m.edited_at)


def _passage_fields(p: Passage) -> tuple[object, ...]:
    return (p.created_at, p.text, p.source or "", p.position or "", p.source is None, p.position is None, p.place)


def _conversation_fields(c: ConversationRecord) -> tuple[object, ...]:
    return (c.place, c.name, c.summary, c.summary_updated_at)


def _same_vector(a: list[float] | None, b: list[float] | None) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-7) for x, y in zip(a, b, strict=True))


async def _verify(
    source: Store, target: Store, agent: AgentRecord, copy_id: str, messages: list[Message], passages: list[Passage]
) -> list[str]:
    """What differs between the agent in the source and its copy."""
    problems: list[str] = []
    copy = await target.find_agent(agent.key)
    if copy is None or copy.id != copy_id:
        return ["the copy is missing from the target"]
    conversations = await source.list_conversations(agent.id)
    copied_conversations = await target.list_conversations(copy_id)
    if list(map(_conversation_fields, copied_conversations)) != list(map(_conversation_fields, conversations)):
        problems.append("summary differs")
    copied = await target.messages_since(copy_id, 0)
    if await target.count_messages(copy_id) != len(messages) or len(copied) != len(messages):
        problems.append(f"{len(copied)} messages in the target, {len(messages)} in the source")
    elif [_message_fields(m) for m in copied] != [_message_fields(m) for m in messages]:
        problems.append("message contents differ")
    elif [m.seq for m in messages] == list(range(1, len(messages) + 1)):
        starts = [c.queue_start_seq for c in conversations]
        copied_starts = [c.queue_start_seq for c in copied_conversations]
        if [m.seq for m in copied] != [m.seq for m in messages] or copied_starts != starts:
            problems.append("message seqs or the queue start differ")
    blocks, copied_blocks = await source.load_blocks(agent.id), await target.load_blocks(copy_id)
    if blocks != copied_blocks:
        problems.append("working context blocks differ")
    copied_passages = await _all_passages(target, copy_id)
    if await target.count_passages(copy_id) != len(passages) or len(copied_passages) != len(passages):
        problems.append(f"{len(copied_passages)} passages in the target, {len(passages)} in the source")
    else:
        pairs = zip(sorted(passages, key=_passage_fields), sorted(copied_passages, key=_passage_fields), strict=True)
        same = (_passage_fields(a) == _passage_fields(b) and _same_vector(a.embedding, b.embedding) for a, b in pairs)
        if not all(same):
            problems.append("passage contents or embeddings differ")
    if await target.list_documents(copy_id) != await source.list_documents(agent.id):
        problems.append("loaded-file records differ")
    return problems


# -- command line ----------------------------------------------------------------
def add_migrate_command(
    subparsers: argparse._SubParsersAction,  # type: ignore[type-arg]
    parents: Sequence[argparse.ArgumentParser] = (),
) -> argparse.ArgumentParser:
    """Register `migrate --from SPEC --to SPEC [--no-progress]`; the handler is cmd_migrate."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "migrate",
        parents=list(parents),
        help="copy all memory from one store to another (SQLite <-> MongoDB)",
        description="Copy every agent (blocks, summary, messages, passages with embeddings, loaded-file records), "
        "every shared collection with its attachments, every check-in and reminder, time zones and quiet hours, "
        "exemptions from the usage limits and channel memory choices from one store to another, then verify each. "
        "SPEC is sqlite:PATH or a MongoDB URI (mongodb://HOST/DATABASE?OPTIONS; database default 'memgpt').",
    )
    parser.add_argument("--from", dest="source", required=True, metavar="SPEC", help="the store to copy from")
    parser.add_argument("--to", dest="target", required=True, metavar="SPEC", help="the store to copy into")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on standard error")
    parser.set_defaults(func=cmd_migrate)
    return parser


async def cmd_migrate(args: argparse.Namespace, settings: object = None) -> int:
    """Run the migration; the report goes to standard output. 0 if everything
    was copied and verified, 1 otherwise. StoreError (unreachable server, bad
    spec...) propagates for the CLI to print as one line."""
    from_spec = parse_spec(args.source)
    if from_spec.same_store(parse_spec(args.target)):
        raise MigrationError("--from and --to name the same store")
    if from_spec.scheme == "sqlite" and not await asyncio.to_thread(Path(from_spec.location).is_file):
        # Opening it would create an empty database and "copy" nothing from it.
        raise MigrationError(f"the source {args.source} does not exist (nothing to copy; check the path)")
    source, target = open_store(args.source), open_store(args.target)
    await source.open()
    try:
        await target.open()
        try:
            report = await migrate(source, target, progress=not args.no_progress)
        finally:
            await target.close()
    finally:
        await source.close()
    print(report.summary(), flush=True)
    return 0 if report.ok else 1
