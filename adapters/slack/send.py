"""Replies out to Slack: mrkdwn, split to the platform's limit, posted in
order with chat.postMessage where `reply_to` says, and what each attempt
came to (sent, worth a retry, or never deliverable) for the bot's outbox.

Each part of a reply with an outbox entry carries that id in its message
metadata, so a reply re-sent after a crash first looks in the conversation
for the parts already there (`_parts_posted`) and sends only the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.api import CALL_ERRORS, error_code
from adapters.slack.config import REPLY_LIMIT
from adapters.slack.directory import Directory
from adapters.slack.format import markdown_to_mrkdwn
from adapters.splitting import split_message
from bot.events import Delivery, Reply

log = logging.getLogger(__name__)

# Errors that mean the reply can never arrive: the person left, deactivated
# their account, or blocked the bot; the place is gone or closed to it.
GONE = frozenset(
    {
        "channel_not_found",
        "is_archived",
        "not_in_channel",
        "account_inactive",
        "user_not_found",
        "user_disabled",
        "cannot_dm_bot",
        "messages_tab_disabled",
        "restricted_action",
        "user_not_visible",
        "team_access_not_granted",
    }
)
METADATA_TYPE = "memgpt_reply"  # message metadata that names a reply's outbox entry


class SlackSender:
    """Posts replies; sends only, never decides whether to try again (the outbox does)."""

    def __init__(self, client: AsyncWebClient, directory: Directory) -> None:
        self.client = client
        self.directory = directory

    async def send(self, reply: Reply) -> tuple[Delivery, str]:
        """Post one reply where its `reply_to` says: `{"channel": C, "thread_ts"?: TS,
        "mention"?: USER}` or `{"dm_user": USER}` (the user's DM, opened on demand)."""
        try:
            channel = await self._reply_channel(reply.reply_to)
        except SlackApiError as error:
            code = error_code(error)
            return (Delivery.UNDELIVERABLE if code in GONE else Delivery.RETRY), f"conversations.open: {code}"
        except CALL_ERRORS as error:
            return Delivery.RETRY, f"conversations.open: {error_code(error)}"
        if channel is None:
            return Delivery.UNDELIVERABLE, "nowhere to send it"
        text = markdown_to_mrkdwn(reply.text)
        if reply.reply_to.get("mention"):
            text = f"<@{reply.reply_to['mention']}> {text}"
        thread_ts = reply.reply_to.get("thread_ts")
        # Parts already on Slack, when a crash or an unclear failure came between
        # a send and its confirmation: each part carries its outbox id.
        posted = await self._parts_posted(channel, thread_ts, reply.outbox_id) if reply.resend else set()
        chunks = [chunk for chunk in split_message(text, REPLY_LIMIT) if chunk.strip()]
        for part, chunk in enumerate(chunks):
            if part in posted:
                continue
            metadata = {"event_type": METADATA_TYPE, "event_payload": {"outbox_id": reply.outbox_id, "part": part}}
            extra: dict[str, Any] = {"thread_ts": thread_ts} if thread_ts else {}
            if reply.outbox_id:
                extra["metadata"] = metadata
            try:
                await self.client.chat_postMessage(channel=channel, text=chunk, **extra)
            except CALL_ERRORS as error:
                code = error_code(error)
                log.error("slack: chat.postMessage to %s failed: %s", channel, code)
                # The rest would fail the same way, or arrive out of order.
                return (Delivery.UNDELIVERABLE if code in GONE else Delivery.RETRY), f"chat.postMessage: {code}"
        return Delivery.SENT, ""

    async def _parts_posted(self, channel: str, thread_ts: str | None, outbox_id: str) -> set[int]:
        """Which parts of a reply are already in the conversation (recent history)."""
        try:
            if thread_ts:
                found = await self.client.conversations_replies(
                    channel=channel, ts=thread_ts, include_all_metadata=True, limit=200
                )
            else:
                found = await self.client.conversations_history(channel=channel, include_all_metadata=True, limit=100)
        except CALL_ERRORS as error:
            # Without history access (a scope missing), sending twice beats never sending.
            log.warning(
                "slack: cannot check %s for reply %s before resending it: %s", channel, outbox_id, error_code(error)
            )
            return set()
        parts = set()
        for message in found.get("messages") or []:
            metadata = message.get("metadata") or {}
            payload = metadata.get("event_payload") or {}
            if metadata.get("event_type") == METADATA_TYPE and payload.get("outbox_id") == outbox_id:
                parts.add(int(payload.get("part", 0)))
        return parts

    async def _reply_channel(self, reply_to: Mapping[str, Any]) -> str | None:
        if reply_to.get("channel"):
            return str(reply_to["channel"])
        user = reply_to.get("dm_user")
        if not user:
            log.error("slack: a reply has nowhere to go (%s)", sorted(reply_to))
            return None
        return await self.directory.dm_channel(str(user))
