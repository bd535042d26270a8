"""A platform in memory: the official test double of the platform contract.

Like httpx's MockTransport, it is a real implementation of the contract
(adapters/pipeline.py) with no network behind it: `message()` is a person
writing, `sent` is what reached them, `fail_sends` makes the platform refuse
(RETRY) for a while. Tests of the pipeline, the runtime behind it, or a new
platform's expectations run the one durable path through it.

    platform = FakePlatform()
    pipeline = Pipeline(runtime, platform)
    await platform.message(pipeline, "alice", "hello")   # answered when it returns
    assert [reply.text for reply in platform.sent] == [...]
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from adapters.pipeline import Arrival, Item, Pipeline
from bot.events import Delivery, Reply, UserMessage

PLATFORM = "fake"


@dataclass
class FakePlatform:
    """Messages in from `message()`, replies out to `sent`."""

    name: str = PLATFORM
    redelivers: bool = False
    sent: list[Reply] = field(default_factory=list)
    fail_sends: int = 0  # the next this many sends fail for a passing reason
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def arrival(self, user_id: str, text: str, *, conversation: str = "dm", event_id: str = "") -> Arrival:
        """A person's message as the platform would hand it to the pipeline."""
        event_id = event_id or f"{self.name}-{next(self._ids)}"
        payload = {"event_id": event_id, "user_id": user_id, "text": text, "conversation": conversation}
        return self.arrival_of(payload)

    async def message(
        self, pipeline: Pipeline, user_id: str, text: str, *, conversation: str = "dm", event_id: str = ""
    ) -> None:
        """A person writes; returns once the pipeline has answered it (or it joined a burst)."""
        task = await pipeline.take(self.arrival(user_id, text, conversation=conversation, event_id=event_id))
        if task is not None:
            await task

    # -- the platform contract ----------------------------------------------------
    def arrival_of(self, payload: Mapping[str, Any]) -> Arrival:
        return Arrival(
            event_id=str(payload["event_id"]),
            user_id=str(payload["user_id"]),
            conversation=str(payload["conversation"]),
            payload=dict(payload),
            mergeable=True,
        )

    async def build(self, arrival: Arrival) -> list[Item]:
        payload = arrival.payload
        message = UserMessage(
            platform=self.name,
            user_id=arrival.user_id,
            text=str(payload["text"]),
            display_name=arrival.user_id,
            event_id=arrival.event_id,
            reply_to={"conversation": arrival.conversation},
            in_inbox=arrival.in_inbox,
        )
        return [message]

    async def send(self, reply: Reply, answering: Arrival | None) -> tuple[Delivery, str]:
        if self.fail_sends > 0:
            self.fail_sends -= 1
            return Delivery.RETRY, "the fake platform is down"
        self.sent.append(reply)
        return Delivery.SENT, ""

    def notice(self, arrival: Arrival, text: str) -> Reply:
        return Reply(text, self.name, arrival.user_id, {"conversation": arrival.conversation}, arrival.event_id)

    def working(self, arrival: Arrival) -> AbstractAsyncContextManager[None]:
        return nullcontext()
