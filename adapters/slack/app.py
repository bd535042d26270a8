"""The Slack connection: the Web API client, the Bolt app, and how events reach
it, Socket Mode (SLACK_APP_TOKEN) or HTTP (SLACK_SIGNING_SECRET), from the
credential check at start-up to closing. What the events mean is the
adapter's business (adapters/slack/adapter.py), not this module's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_bolt.middleware.authorization.async_single_team_authorization import AsyncSingleTeamAuthorization
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.api import error_code
from adapters.slack.config import SlackConfig, SlackSetupError

log = logging.getLogger(__name__)

EVENTS_PATH = "/slack/events"
# Slack unreachable at start (network, Slack's 5xx): retried, 2 s doubling up to 5 min,
# as the Discord adapter does, so an outage at start does not stop the bot.
CONNECT_RETRY_FIRST = 2.0
CONNECT_RETRY_MAX = 300.0


class _Without(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


class SlackApp:
    """One Web API client and one Bolt app; `connect()` starts receiving, `stop_receiving()`
    and `close()` end it."""

    def __init__(self, config: SlackConfig) -> None:
        self.config = config
        self.client = AsyncWebClient(
            token=config.bot_token,
            base_url=config.api_url or AsyncWebClient.BASE_URL,
            # Slack rate-limits chat.postMessage per channel (HTTP 429 + Retry-After): wait and retry.
            retry_handlers=[AsyncConnectionErrorRetryHandler(), AsyncRateLimitErrorRetryHandler(max_retry_count=3)],
        )
        # Bolt warns that SLACK_BOT_TOKEN "will be unused" whenever that variable is set
        # and a client is given, which is how this bot is always run: a false alarm.
        bolt_log, quiet = logging.getLogger("slack_bolt.AsyncApp"), _Without("`token` will be unused")
        bolt_log.addFilter(quiet)
        try:
            self.bolt = AsyncApp(
                name="memgpt-bot",
                client=self.client,
                signing_secret=config.signing_secret or "",
                request_verification_enabled=not config.socket_mode,
                # The listeners record each event in the bot's inbox and return
                # (no LLM work): only then does Bolt acknowledge it, so an event
                # Slack stops retrying is never one the bot did not keep.
                process_before_response=True,
            )
        finally:
            bolt_log.removeFilter(quiet)
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._socket: AsyncSocketModeHandler | None = None

    async def connect(self, identify: Callable[[Mapping[str, Any]], None]) -> bool:
        """Check the credentials (auth.test, whose answer goes to `identify` before any
        event can arrive) and start receiving events; False if already connected."""
        if self._session is not None:
            return False
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        self.client.session = self._session  # one connection pool for every Web API call
        try:
            identify(await self._check_credentials())
            if self.config.socket_mode:
                await self._connect_socket_mode()
            else:
                await self._listen_http()
        except BaseException:
            await self._session.close()
            self._session = self.client.session = None
            raise
        return True

    async def _check_credentials(self) -> Mapping[str, Any]:
        try:
            auth = await _retrying(self.client.auth_test, "auth.test")
        except SlackApiError as error:
            raise SlackSetupError(f"Slack rejected SLACK_BOT_TOKEN (auth.test: {error_code(error)})") from None
        # Bolt's single-workspace authorization calls auth.test itself on the first
        # event, and events that arrive together each wait for their own call and may
        # overtake one another. Handing it this answer keeps even the first burst in order.
        for middleware in getattr(self.bolt, "_async_middleware_list", []):
            if isinstance(middleware, AsyncSingleTeamAuthorization) and middleware.auth_test_result is None:
                middleware.auth_test_result = auth
        return auth.data if isinstance(auth.data, dict) else {}

    async def _connect_socket_mode(self) -> None:
        assert self.config.app_token is not None
        handler = AsyncSocketModeHandler(self.bolt, self.config.app_token, web_client=self.client)
        # Ask for the WebSocket URL ourselves: the Socket Mode client retries a bad
        # app token forever, while a clear error at start-up is what a person needs.
        try:
            token = self.config.app_token
            opened = await _retrying(
                lambda: self.client.apps_connections_open(app_token=token), "apps.connections.open"
            )
        except SlackApiError as error:
            await handler.close_async()  # type: ignore[no-untyped-call]  # slack-sdk leaves it unannotated
            raise SlackSetupError(
                f"Slack rejected SLACK_APP_TOKEN (apps.connections.open: {error_code(error)})"
            ) from None
        handler.client.wss_uri = opened["url"]
        await handler.connect_async()  # type: ignore[no-untyped-call]  # slack-sdk leaves it unannotated
        self._socket = handler
        log.info("slack: connected in Socket Mode")

    async def _listen_http(self) -> None:
        web_app = web.Application()
        web_app.router.add_post(EVENTS_PATH, self._on_http_request)
        runner = web.AppRunner(web_app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.config.http_host, self.config.http_port).start()
        except BaseException:  # e.g. the port is taken
            await runner.cleanup()
            raise
        self._runner = runner
        log.info("slack: listening on http://%s:%s%s", self.config.http_host, self.port, EVENTS_PATH)

    async def _on_http_request(self, request: web.Request) -> web.Response:
        bolt_response = await self.bolt.async_dispatch(await to_bolt_request(request))
        return await to_aiohttp_response(bolt_response)

    @property
    def port(self) -> int | None:
        """The bound HTTP port in HTTP mode once listening (useful with port 0), else None."""
        if self._runner is None or not self._runner.addresses:
            return None
        return int(self._runner.addresses[0][1])

    async def stop_receiving(self) -> None:
        """Close the Socket Mode connection or the HTTP listener; sending still works."""
        if self._socket is not None:
            await self._socket.close_async()  # type: ignore[no-untyped-call]  # slack-sdk leaves it unannotated
        if self._runner is not None:
            await self._runner.cleanup()

    async def close(self) -> None:
        """Close the Web API session (after `stop_receiving` and the last send)."""
        if self._session is not None:
            await self._session.close()


async def _retrying(call: Callable[[], Awaitable[Any]], method: str) -> Any:
    """`call()`, again with backoff while Slack cannot be reached or answers 5xx (saying
    so each time); a refusal (a bad token, a missing scope) is raised at once."""
    delay = CONNECT_RETRY_FIRST
    while True:
        try:
            return await call()
        except SlackApiError as error:
            if error.response.status_code < 500:
                raise
            why = f"{method} answered HTTP {error.response.status_code}"
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            why = f"{type(error).__name__}: {error}"
        log.warning("slack: cannot reach the Slack Web API (%s); retrying in %.0f s", why, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, CONNECT_RETRY_MAX)
