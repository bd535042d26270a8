"""The whole bot in one process: `serve()` runs the configured adapters on one
runtime and the check-in scheduler delivers through them."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from cli.app import serve
from memory.schedules import Schedule, new_schedule_id
from memory.types import utc_now
from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer, reply_tool_calls, tool_call
from tests.fake_slack import FakeSlack
from tests.helpers import free_port


async def test_a_missed_check_in_fires_once_at_start_through_slack(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.set_handler(
        lambda request: reply_tool_calls(tool_call("send_message", {"message": "Good morning! How did the exam go?"}))
    )
    runtime = await make_runtime()
    due = utc_now().replace(microsecond=0) - timedelta(minutes=5)  # missed while "down", within the grace period
    await runtime.schedules.add(
        Schedule(
            id=new_schedule_id(),
            agent_key="slack:T1:U1",
            platform="slack",
            user_id="T1:U1",
            kind="daily",
            timezone="Europe/Paris",
            time_of_day=due.astimezone().strftime("%H:%M"),
            note="morning check-in",
            reply_to={"dm_user": "U1"},
            next_fire_at=due,
        )
    )
    announced: list[str] = []
    with FakeSlack() as slack:
        slack.add_user("U1", "Alice")
        env = {
            "SLACK_BOT_TOKEN": slack.bot_token,
            "SLACK_SIGNING_SECRET": "s3cret",
            "SLACK_API_URL": slack.api_url,
            "SLACK_HTTP_HOST": "127.0.0.1",
            "SLACK_HTTP_PORT": str(free_port()),
        }
        serving = asyncio.create_task(serve(runtime, announced.append, env))
        try:
            [posted] = await slack.wait_for("chat.postMessage", 1, within=20)
            assert posted.args["text"] == "Good morning! How did the exam go?"
            assert posted.args["channel"].startswith("D")  # the DM opened for U1
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
    assert any(line.startswith("slack: starting, HTTP mode") for line in announced)
    assert any(line.startswith("discord: skipped") for line in announced)
    assert any(line.startswith("check-ins: scheduler started") for line in announced)
    tick_requests = [r for r in llm_server.requests if "[scheduled tick]" in str(r["messages"][-1].get("content"))]
    assert len(tick_requests) == 1
    [schedule] = await runtime.schedules.list_for_user("slack:T1:U1")
    assert schedule.next_fire_at is not None and schedule.next_fire_at > utc_now()
