"""Files people share with the bot on Slack: which ones it reads, and their
bytes, fetched with the bot token (which goes to Slack's own hosts only) and
never more than the upload limit held in memory."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.api import CALL_ERRORS, error_code
from adapters.slack.config import SlackConfig
from bot.ports import readable

# Slack's `filetype` of the readable kinds, for a file whose name says nothing.
UPLOAD_FILETYPES = {"text": "text/plain", "markdown": "text/markdown", "html": "text/html", "pdf": "application/pdf"}


class DownloadError(Exception):
    """Why a shared file could not be fetched; the text is shown to nobody but the log."""


class FileRefused(Exception):
    """A file the bot will not read; the text tells the person why."""


@dataclass(frozen=True, slots=True)
class SharedFile:
    name: str
    content_type: str
    data: bytes


def human_size(count: int) -> str:
    for unit, scale in (("MB", 1024 * 1024), ("KB", 1024)):
        if count >= scale:
            return f"{count / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{count} bytes"


class FileReader:
    """Reads shared files through the Web API client's session (one connection pool)."""

    def __init__(self, client: AsyncWebClient, config: SlackConfig) -> None:
        self.client = client
        self.config = config

    async def read(self, shared: Mapping[str, Any]) -> SharedFile:
        """The file, or FileRefused (tell the person) or DownloadError (log it)."""
        if shared.get("file_access") == "check_file_info" or not shared.get("url_private_download"):
            try:
                shared = (await self.client.files_info(file=str(shared["id"])))["file"]
            except CALL_ERRORS as error:
                raise DownloadError(f"files.info failed: {error_code(error)}") from None
        name = str(shared.get("name") or shared.get("title") or shared.get("id") or "file")
        content_type = str(shared.get("mimetype") or UPLOAD_FILETYPES.get(str(shared.get("filetype") or "")) or "")
        if not readable(name, content_type):
            raise FileRefused(
                f"I can only read text (.txt), Markdown (.md), HTML and PDF files, so I didn't save {name}."
            )
        too_large = FileRefused(
            f"{name} is too large: I can read files of up to {human_size(self.config.max_upload_bytes)}."
        )
        if int(shared.get("size") or 0) > self.config.max_upload_bytes:
            raise too_large
        is_html = content_type == "text/html" or name.lower().endswith((".html", ".htm", ".xhtml"))
        url = str(shared.get("url_private_download") or shared.get("url_private") or "")
        data = await self._download(url, html_expected=is_html)
        if data is None:
            raise too_large
        return SharedFile(name, content_type, data)

    def _may_send_token_to(self, url: str) -> bool:
        """The bot token goes only to Slack's own hosts (or the configured API host)."""
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        if parts.scheme == "https" and (host == "slack.com" or host.endswith(".slack.com")):
            return True
        if self.config.api_url:
            api = urlsplit(self.config.api_url)
            return (parts.scheme, parts.netloc) == (api.scheme, api.netloc)
        return False

    async def _download(self, url: str, *, html_expected: bool = False) -> bytes | None:
        """The file's bytes; None if it is larger than the upload limit."""
        if not self._may_send_token_to(url):
            raise DownloadError("not a Slack file URL")
        session = self.client.session
        if session is None:
            raise DownloadError("the adapter is not connected")
        limit = self.config.max_upload_bytes
        headers = {"Authorization": f"Bearer {self.config.bot_token}"}
        try:
            async with session.get(url, headers=headers) as response:
                if response.status != 200:
                    raise DownloadError(f"HTTP {response.status}")
                if response.content_type == "text/html" and not html_expected:
                    # Without the files:read scope Slack answers with its sign-in page.
                    raise DownloadError("Slack sent a web page instead of the file (is files:read granted?)")
                data = bytearray()
                async for chunk in response.content.iter_chunked(64 * 1024):
                    data += chunk
                    if len(data) > limit:  # the announced size may be wrong; never hold more than the limit
                        return None
                return bytes(data)
        except (aiohttp.ClientError, TimeoutError) as error:
            raise DownloadError(type(error).__name__) from None
