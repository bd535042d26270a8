"""Channel modes on every Store backend (the ChannelStore role's mode calls,
memory/roles.py): a mode set by channel key and read back, nothing set reads
None, and the one-time "this channel now listens" notice claimed once, across
processes (a second store on the same database), until "mention" re-arms it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from memory.store import Store

GENERAL = "slack:T01:C01"
RANDOM = "slack:T01:C02"
ELSEWHERE = "slack:T99:C01"  # the same channel id in another workspace
T0 = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)


async def test_a_mode_is_kept_by_channel_key_and_nothing_set_reads_none(store: Store) -> None:
    assert await store.channel_mode(GENERAL) is None
    await store.set_channel_mode(GENERAL, "listen", T0)
    assert await store.channel_mode(GENERAL) == "listen"
    assert await store.channel_mode(ELSEWHERE) is None and await store.channel_mode(RANDOM) is None
    await store.set_channel_mode(GENERAL, "open", T0 + timedelta(minutes=1))
    await store.set_channel_mode(RANDOM, "mention", T0)
    assert await store.channel_mode(GENERAL) == "open"
    assert await store.channel_mode(RANDOM) == "mention"


async def test_the_notice_is_claimed_once_until_mention_re_arms_it(store: Store) -> None:
    # A channel listening by the operator's setting has no mode stored: it is claimed all the same.
    assert await store.claim_channel_notice(RANDOM, T0)
    assert not await store.claim_channel_notice(RANDOM, T0)
    assert await store.channel_mode(RANDOM) is None  # claiming sets no mode

    await store.set_channel_mode(GENERAL, "listen", T0)
    assert await store.claim_channel_notice(GENERAL, T0)
    assert not await store.claim_channel_notice(GENERAL, T0 + timedelta(seconds=1))
    await store.set_channel_mode(GENERAL, "open", T0)  # still listening: not said again
    assert not await store.claim_channel_notice(GENERAL, T0)
    await store.set_channel_mode(GENERAL, "mention", T0)
    await store.set_channel_mode(GENERAL, "listen", T0)
    assert await store.claim_channel_notice(GENERAL, T0)
    assert not await store.claim_channel_notice(GENERAL, T0)
    assert await store.channel_mode(GENERAL) == "listen"
    assert await store.claim_channel_notice(ELSEWHERE, T0)  # another workspace's channel is its own


async def test_of_many_claims_from_two_processes_exactly_one_wins(store: Store, twin: Store) -> None:
    for round_ in range(3):
        channel = f"discord:G1:{round_}"
        if round_ == 2:  # a stored mode first: the claim updates the row
            await store.set_channel_mode(channel, "listen", T0)
        claims = [(store if n % 2 else twin).claim_channel_notice(channel, T0) for n in range(8)]
        assert sum(await asyncio.gather(*claims)) == 1, channel
    await twin.set_channel_mode("discord:G1:0", "mention", T0)
    assert await store.claim_channel_notice("discord:G1:0", T0)
    assert await store.channel_mode("discord:G1:0") == "mention"
