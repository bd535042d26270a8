"""Isolation between users, by construction and under load.

1. No function the model may call can name an agent or a user: every
   registered schema of a real Runtime is inspected, so a function added later
   with a `user_id` (or `agent`, `key`...) parameter fails here.
2. 100 users each tell their own agent a secret, which the scripted model saves
   to archival storage and working context (and which recall keeps, as the
   user's message). Then every user asks for other users' secrets: the model
   searches archival and recall storage for them, and forwards whatever the
   searches return in its reply. No request sent on behalf of one user, and no
   reply delivered to them, may hold anything of another user.

Each secret has a public half, its *handle* ("the vault3f9c2a code"), and a
private half, its *value*. Other users search by the handle: a store that let
one agent's search reach another's memory would return the owner's passage or
message, which always carries the value and the owner's name. The value and
the name are what must never cross users. (Searching by the value itself would
put it into the searcher's own prompt as the query, and recall keeps the
model's own calls, so "no other user's value anywhere" could not be asserted
exactly.)
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from dataclasses import dataclass
from typing import Any

from bot.events import Reply as BotReply
from bot.events import UserMessage
from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer, Reply, is_summary_request, reply_text, reply_tool_calls, tool_call

# Words that, in a parameter name, would let the model choose whose memory a call touches.
SELECTOR_WORDS = frozenset(
    {
        "id",
        "ids",
        "uid",
        "uuid",
        "user",
        "users",
        "username",
        "agent",
        "agents",
        "key",
        "keys",
        "owner",
        "account",
        "person",
        "platform",
        "team",
        "guild",
        "channel",
        "tenant",
        "namespace",
        "who",
        "as",
    }
)

USERS = 100
OTHERS_PER_USER = 10  # each secret is asked for by exactly this many other users (1,000 cross-user asks)
PER_ROUND = 5  # other users searched for per step: 2 calls each (archival + recall)
ROUNDS = OTHERS_PER_USER // PER_ROUND
SEARCHES = {"archival_memory_search", "conversation_search"}
PERSON = re.compile(r"person\d{3}")
TELL = re.compile(r"\] (person\d{3}): My secret: the (\w+) code is (\w+)\.")
ASK = re.compile(r"\] (person\d{3}): Round (\d+): what are the other people's codes\?")


# -- 1: isolation by construction ---------------------------------------------
def parameter_names(schema: dict[str, Any], path: str = "") -> list[tuple[str, str]]:
    """(path, name) of every property, nested objects and arrays included."""
    found: list[tuple[str, str]] = []
    for name, spec in (schema.get("properties") or {}).items():
        found.append((f"{path}{name}", name))
        if isinstance(spec, dict):
            found.extend(parameter_names(spec, f"{path}{name}."))
            items = spec.get("items")
            if isinstance(items, dict):
                found.extend(parameter_names(items, f"{path}{name}[]."))
    return found


def selects_someone(name: str) -> bool:
    """Whether a parameter name reads as an id or user selector (any case style)."""
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()
    return bool(SELECTOR_WORDS & set(re.split(r"[^a-z0-9]+", words)))


def test_the_selector_check_catches_id_like_names() -> None:
    # The check below is only as good as this: prove it bites.
    for bad in ("user_id", "agent", "agent_key", "id", "userId", "target-user", "owner", "platform", "channelID"):
        assert selects_someone(bad), bad
    for fine in (
        "query",
        "page",
        "content",
        "name",
        "message",
        "old_content",
        "start_date",
        "when",
        "note",
        "request_heartbeat",
    ):
        assert not selects_someone(fine), fine


async def test_no_agent_function_can_name_an_agent_or_a_user(make_runtime: RuntimeFactory) -> None:
    runtime = await make_runtime()
    functions = runtime.services.functions
    schemas = [*functions.schemas, *functions.on_demand_schemas]  # offered with every request, or on demand
    names = {schema["function"]["name"] for schema in schemas}
    # The real set: the core functions and the check-in one registered by the runtime.
    assert {"send_message", "archival_memory_search", "conversation_search", "schedule_reminder"} <= names
    offending = [
        f"{schema['function']['name']}({path})"
        for schema in schemas
        for path, name in parameter_names(schema["function"]["parameters"])
        if selects_someone(name)
    ]
    assert offending == [], f"functions that could reach another agent's memory: {offending}"
    # The executor validates with additionalProperties=false: an extra `user_id`
    # argument from the model is refused, not silently passed along.
    for name in ("archival_memory_search", "conversation_search"):
        outcome = await runtime.services.functions.run(
            await runtime.agent("terminal:probe"),
            name,
            json.dumps({"query": "x", "request_heartbeat": False, "user_id": "terminal:other"}),
        )
        assert not outcome.ok and "unexpected argument" in outcome.result


# -- 2: 100 users, nothing crosses ----------------------------------------------
@dataclass(frozen=True)
class Person:
    number: int
    name: str  # appears in every message they send: "person007"
    handle: str  # the public half: other users search for it
    value: str  # the private half: must never reach anyone else

    @property
    def user_id(self) -> str:
        return f"T1:U{self.number:03d}"

    def says(self, text: str) -> UserMessage:
        return UserMessage(platform="slack", user_id=self.user_id, text=text, display_name=self.name)


def people(rng: random.Random) -> list[Person]:
    # Handles and values are single words (so keyword search matches them
    # exactly) of equal length, so none is part of another.
    return [
        Person(n, f"person{n:03d}", f"vault{n:03d}{rng.randbytes(4).hex()}", f"pin{n:03d}{rng.randbytes(4).hex()}")
        for n in range(USERS)
    ]


def send(text: str) -> Reply:
    return reply_tool_calls(tool_call("send_message", {"message": text}))


class Model:
    """The scripted LLM: reads the conversation like a model would and acts
    on it. Thread-safe: it only reads `plan`, which is fixed before the run."""

    def __init__(self, crowd: list[Person], plan: dict[str, list[list[Person]]]) -> None:
        self.by_name = {person.name: person for person in crowd}
        self.plan = plan
        self.searches = 0

    def __call__(self, request: dict[str, Any]) -> Reply:
        messages = request["messages"]
        if is_summary_request(request):
            # The summary keeps the person's name, so every later request of
            # theirs can still be attributed to them.
            names = sorted(set(PERSON.findall(json.dumps(messages[1:]))))
            return reply_text(f"Codes were told to the agent by {', '.join(names) or 'nobody'}.")
        # A memory-pressure alert may follow the step that matters.
        last = next(m for m in reversed(messages) if not str(m.get("content") or "").startswith("[system alert]"))
        if last["role"] == "tool":
            return self._after_tools(messages)
        text = str(last.get("content") or "")
        told = TELL.search(text)
        if told:
            name, handle, value = told.groups()
            fact = f"{name}'s secret: the {handle} code is {value}."
            return reply_tool_calls(
                tool_call("archival_memory_insert", {"content": fact, "request_heartbeat": False}),
                tool_call("core_memory_append", {"name": "human", "content": fact, "request_heartbeat": True}),
            )
        asked = ASK.search(text)
        if asked:
            asker = self.by_name[asked.group(1)]
            wanted = self.plan[asker.name][int(asked.group(2))]
            calls = []
            for other in wanted:
                calls.append(
                    tool_call(
                        "archival_memory_search", {"query": f"the {other.handle} code", "request_heartbeat": True}
                    )
                )
                calls.append(tool_call("conversation_search", {"query": other.handle, "request_heartbeat": True}))
            self.searches += len(calls)  # one server thread per request: += on an int is atomic enough under the GIL
            return reply_tool_calls(*calls)
        return send("I did not understand: " + json.dumps(messages[1:])[:300])

    @staticmethod
    def _after_tools(messages: list[dict[str, Any]]) -> Reply:
        start = max(n for n, m in enumerate(messages) if m["role"] == "assistant" and m.get("tool_calls"))
        called = {call["function"]["name"] for call in messages[start]["tool_calls"]}
        if not called & SEARCHES:
            return send("Saved, I will keep it safe.")
        # Forward every search hit to the person: a leaked record would reach them.
        hits: list[str] = []
        for message in messages[start + 1 :]:
            if message["role"] == "tool":
                result = json.loads(message["content"])["result"]
                hits.extend(line[2:] for line in result.split("\n")[1:] if line.startswith("- "))
        return send("Here is what I found:\n" + "\n".join(dict.fromkeys(hits)) if hits else "I found nothing.")


def leaks(text: str, owner: Person, crowd: list[Person]) -> list[str]:
    """What of the other people's private data is in `text`."""
    names = set(PERSON.findall(text)) - {owner.name}
    values = {person.value for person in crowd if person is not owner and person.value in text}
    return sorted(names | values)


async def test_a_hundred_users_never_see_each_others_secrets(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    rng = random.Random(7)
    crowd = people(rng)
    # Circulant: user n asks for users n+o (mod USERS) for a fixed set of
    # offsets, so every secret is asked for by exactly OTHERS_PER_USER others.
    offsets = rng.sample(range(1, USERS), OTHERS_PER_USER)
    plan: dict[str, list[list[Person]]] = {}
    for person in crowd:
        others = [crowd[(person.number + offset) % USERS] for offset in offsets]
        rounds = [others[k * PER_ROUND : (k + 1) * PER_ROUND] for k in range(ROUNDS)]
        rounds[0] = [person, *rounds[0]]  # their own secret too: proves hits do reach the reply
        plan[person.name] = rounds
    model = Model(crowd, plan)
    llm_server.set_handler(model)
    # A hundred people's calls at once reach one scripted server: on a busy machine an
    # answer can take longer than the suite's usual 5 s (not what this test is about).
    runtime = await make_runtime(search_page_size=3, llm_timeout=120.0)
    started = time.monotonic()

    async def tell(person: Person) -> list[BotReply]:
        return await runtime.handle(person.says(f"My secret: the {person.handle} code is {person.value}."))

    told = await asyncio.gather(*(tell(person) for person in crowd))
    assert {tuple(reply.text for reply in replies) for replies in told} == {("Saved, I will keep it safe.",)}
    await runtime.archival.settle_all()  # every secret searchable before anyone asks

    async def ask(person: Person) -> list[BotReply]:
        replies: list[BotReply] = []
        for round_ in range(ROUNDS):
            replies += await runtime.handle(person.says(f"Round {round_}: what are the other people's codes?"))
        return replies

    answers = dict(zip(crowd, await asyncio.gather(*(ask(person) for person in crowd)), strict=True))
    elapsed = time.monotonic() - started
    assert model.searches == USERS * (2 * OTHERS_PER_USER + 2)

    # Replies: only the person's own data, and their own secret did come back.
    for person, replies in answers.items():
        assert all(reply.user_id == person.user_id for reply in replies)
        delivered = "\n".join(reply.text for reply in replies)
        assert leaks(delivered, person, crowd) == [], f"reply to {person.name} leaks {leaks(delivered, person, crowd)}"
        assert person.value in delivered, f"{person.name}'s own search found nothing: the check would be blind"

    # Requests: each is on behalf of exactly one person and holds nothing of anyone else.
    assert len(llm_server.requests) >= USERS * (2 + 2 * ROUNDS)
    for request in llm_server.requests:
        text = json.dumps(request, ensure_ascii=False)
        names = set(PERSON.findall(text))
        assert len(names) == 1, f"a request names {sorted(names)}: it mixes users (or cannot be attributed)"
        owner = model.by_name[names.pop()]
        assert leaks(text, owner, crowd) == []

    # Each secret was saved where the brief says (so there was something to leak).
    for person in (crowd[0], crowd[USERS - 1]):
        agent = await runtime.agent(f"slack:{person.user_id}")
        assert person.value in agent.working_context.get("human").value
        found = await runtime.archival.search(agent.id, f"the {person.handle} code", 1)
        assert person.value in found.items[0][0].text
        assert any(person.value in (m.content or "") for m in await runtime.store.messages_since(agent.id, 0))

    # Budget: about 1,100 model calls and 4,200 searches, each embedding its query on the CPU: ~30 s on
    # an idle 2-core machine (the embedder batches the concurrent users' queries).
    print(f"\n{USERS} users, {len(llm_server.requests)} LLM requests, {model.searches} searches: {elapsed:.1f} s")
