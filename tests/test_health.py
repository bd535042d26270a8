"""/healthz and /metrics: real HTTP to a real runtime whose events go through
the real LLM client to the scripted server (tests/fake_llm.py)."""

from __future__ import annotations

import asyncio
import re

import aiohttp

from bot.events import UserMessage
from cli.health import HealthServer
from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer, reply_tool_calls, tool_call


class Adapter:
    def __init__(self) -> None:
        self.ready = asyncio.Event()

    async def wait_ready(self) -> None:
        await self.ready.wait()


def value(text: str, sample: str) -> float:
    """The value of one sample line (`name{labels}`) of a Prometheus text page."""
    match = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.MULTILINE)
    assert match, f"{sample} not in the metrics page"
    return float(match.group(1))


async def test_health_and_metrics_count_what_happened(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> None:
    runtime = await make_runtime()
    adapter = Adapter()
    server = HealthServer(runtime, {"slack": adapter}, "127.0.0.1", 0)
    await server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/healthz") as answer:
                assert answer.status == 503  # not connected yet
                assert (await answer.json())["platforms"] == {"slack": "not connected"}
            adapter.ready.set()
            await asyncio.sleep(0.05)
            async with http.get(f"{base}/healthz") as answer:
                assert answer.status == 200 and (await answer.json())["store"] == "ok"

            async with http.get(f"{base}/metrics") as answer:
                before = await answer.text()
            usage = {"prompt_tokens": 1200, "completion_tokens": 30, "prompt_tokens_details": {"cached_tokens": 1024}}
            llm_server.script(reply_tool_calls(tool_call("send_message", {"message": "Hello!"}), usage=usage))
            bot = runtime  # its doors count what enters (bot/door.py)
            assert await bot.receive("slack", "ev-1", "U1", {"text": "hi"})
            assert not await bot.receive("slack", "ev-1", "U1", {"text": "hi"})  # a repeat is not counted
            replies = await bot.handle(UserMessage(platform="slack", user_id="U1", text="hi", event_id="ev-1"))
            assert [reply.text for reply in replies] == ["Hello!"]
            async with http.get(f"{base}/metrics") as answer:
                assert answer.status == 200 and answer.content_type == "text/plain"
                after = await answer.text()
    finally:
        await server.close()

    def grew(sample: str) -> float:
        return value(after, sample) - (value(before, sample) if sample in before else 0.0)

    assert grew('memgpt_events_received_total{platform="slack"}') == 1
    assert grew('memgpt_events_handled_total{outcome="replied",platform="slack"}') == 1
    assert grew('memgpt_event_reply_seconds_count{platform="slack"}') == 1
    assert grew('memgpt_llm_calls_total{outcome="ok"}') == 1
    assert grew('memgpt_llm_tokens_total{kind="prompt"}') == 1200
    assert grew('memgpt_llm_tokens_total{kind="cached"}') == 1024
    assert grew('memgpt_llm_tokens_total{kind="completion"}') == 30
    assert value(after, "memgpt_agents_in_memory") == 1
    assert value(after, 'memgpt_inbox_pending{platform="slack"}') == 1  # received, never marked finished
