"""What a call to Slack's Web API may raise, and how to name a failure in a
log line or a delivery report without quoting any payload."""

from __future__ import annotations

import aiohttp
from slack_sdk.errors import SlackApiError

# What a Web API call may raise; none of it may crash the app.
CALL_ERRORS = (SlackApiError, aiohttp.ClientError, TimeoutError)


def error_code(error: BaseException) -> str:
    """A Web API error's code (e.g. channel_not_found), or the exception's type: never a payload."""
    if isinstance(error, SlackApiError):
        return str(error.response.get("error") or error.response.status_code)
    return type(error).__name__
