"""Text between the model's Markdown and Slack's mrkdwn, in both directions.

Outgoing (`markdown_to_mrkdwn`): Slack does not render Markdown. Bold is
`*x*`, italics `_x_`, strike `~x~`, links `<url|text>`, there are no headings,
and `&`, `<` and `>` must be sent as entities because `<...>` is how Slack
spells mentions and links. Code (fenced and inline) keeps its text untouched
by the Markdown rules; it is still entity-escaped, because Slack decodes the
three entities in code too and a raw `<!channel>` in a code span would
otherwise be read as a control sequence.

Incoming (`slack_to_plain`): what a person typed arrives entity-escaped with
mentions and links as `<...>` sequences; the agent should read plain text.

And Slack's other text format, its timestamps (`time_of`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime

_ESCAPES = (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"))

# Private-use characters never typed by a person: placeholders for pieces
# (code, links) that later rules must not touch.
_HOLD_OPEN, _HOLD_CLOSE = "\ue000", "\ue001"
_HOLD = re.compile(f"{_HOLD_OPEN}(\\d+){_HOLD_CLOSE}")
_BOLD_MARK = "\ue002"  # bold's `*`, kept apart from italic `*` until the end

_FENCE = re.compile(r"^([ \t]*)```[^\n`]*\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)
_UNCLOSED_FENCE = re.compile(r"^[ \t]*```[^\n`]*\n(.*)\Z", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
_LINK = re.compile(r"!?\[([^\]\n]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_AUTOLINK = re.compile(r"<((?:https?|mailto):[^>\s]+)>")
_HEADING = re.compile(r"^[ \t]{0,3}#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
_RULE = re.compile(r"^[ \t]{0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$", re.MULTILINE)
_BULLET = re.compile(r"^([ \t]*)[-*+][ \t]+", re.MULTILINE)
_QUOTE = re.compile(r"^([ \t]*)&gt;", re.MULTILINE)
_BOLD = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1", re.DOTALL)
_ITALIC_STAR = re.compile(r"(?<![*\w])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![*\w])")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")


def escape(text: str) -> str:
    """Slack's three entities; everything else is sent as is."""
    for raw, entity in _ESCAPES:
        text = text.replace(raw, entity)
    return text


def unescape(text: str) -> str:
    for raw, entity in reversed(_ESCAPES):
        text = text.replace(entity, raw)
    return text


def _link_url(url: str) -> str:
    # `|` and `>` end the URL part of `<url|text>`; percent-encoding keeps the link whole.
    return escape(url.replace("|", "%7C").replace(">", "%3E"))


def markdown_to_mrkdwn(text: str) -> str:
    """The model's Markdown as Slack mrkdwn."""
    held: list[str] = []

    def hold(piece: str) -> str:
        held.append(piece)
        return f"{_HOLD_OPEN}{len(held) - 1}{_HOLD_CLOSE}"

    def fence(match: re.Match[str]) -> str:
        # Slack shows a language tag as the first line of code, so it is dropped.
        body = match.group(2).rstrip("\n")
        return match.group(1) + hold(f"```\n{escape(body)}\n```")

    text = _FENCE.sub(fence, text.replace("\r\n", "\n"))
    text = _UNCLOSED_FENCE.sub(lambda m: hold(f"```\n{escape(m.group(1).rstrip())}\n```"), text)
    text = _INLINE_CODE.sub(lambda m: hold(f"`{escape(m.group(2))}`"), text)

    def link(match: re.Match[str]) -> str:
        label, url = match.group(1).strip(), match.group(2)
        if not label or label == url:
            return hold(f"<{_link_url(url)}>")
        return hold(f"<{_link_url(url)}|{escape(_strip_emphasis(label))}>")

    text = _LINK.sub(link, text)
    text = _AUTOLINK.sub(lambda m: hold(f"<{_link_url(m.group(1))}>"), text)
    text = escape(text)
    text = _QUOTE.sub(r"\1>", text)  # a quote marker at a line start is mrkdwn too
    text = _HEADING.sub(lambda m: f"{_BOLD_MARK}{_strip_emphasis(m.group(1))}{_BOLD_MARK}", text)
    text = _RULE.sub("──────────", text)
    text = _BULLET.sub(r"\1• ", text)
    text = _BOLD.sub(lambda m: f"{_BOLD_MARK}{m.group(2)}{_BOLD_MARK}", text)
    text = _ITALIC_STAR.sub(r"_\1_", text)
    text = _STRIKE.sub(r"~\1~", text)
    text = text.replace(_BOLD_MARK, "*")
    # Held pieces may hold other held pieces (a link inside code never does, but
    # a label may mention a placeholder); restore until none is left.
    while _HOLD.search(text):
        text = _HOLD.sub(lambda m: held[int(m.group(1))], text)
    return text


def _strip_emphasis(text: str) -> str:
    """Inside a heading or link label, `**` would nest bold in bold; drop it."""
    return re.sub(r"(\*\*|__)(.+?)\1", r"\2", text)


_MENTION = re.compile(r"<([@#!])([^>|]+)(?:\|([^>]*))?>")
_URL = re.compile(r"<([^>|@#!][^>|]*)(?:\|([^>]*))?>")


def slack_to_plain(text: str, name_of: Callable[[str], str | None] | None = None) -> str:
    """What a person typed, as plain text: `<@U1>` -> `@name`, `<#C1|general>` ->
    `#general`, `<https://x|site>` -> `site (https://x)`, entities decoded."""

    def mention(match: re.Match[str]) -> str:
        sigil, target, label = match.groups()
        if sigil == "@":
            name = label or (name_of(target) if name_of else None)
            return f"@{name or target}"
        if sigil == "#":
            return f"#{label or target}"
        # `<!here>`, `<!channel>`, `<!subteam^ID|@team>`, `<!date^...|fallback>`
        if target in ("here", "channel", "everyone"):
            return f"@{target}"
        return label or f"@{target.split('^', 1)[0]}"

    def url(match: re.Match[str]) -> str:
        target, label = match.groups()
        target = target.removeprefix("mailto:") if label and target.startswith("mailto:") else target
        return f"{label} ({target})" if label and label != target else target

    return unescape(_URL.sub(url, _MENTION.sub(mention, text)))


def time_of(ts: str | float | None) -> datetime:
    """A Slack timestamp (`ts`, `event_time`) as an aware datetime; now if there is none."""
    try:
        return datetime.fromtimestamp(float(ts or ""), UTC)
    except ValueError:
        return datetime.now(UTC)
