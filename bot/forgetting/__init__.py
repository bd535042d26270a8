"""Selective forget and the memory ledger: what the bot holds on a person,
item by item, and removing one item or everything about a topic.

- `ledger.py`: the items (working-context lines, saved passages, summaries
  per place, message counts per place), each with where and when it was
  learned, in pages, as text for `/memory` and `memgpt-bot memory show`.
- `matching.py`: what a topic ("my diagnosis") matches, found with the agent's
  own searches (conversation search's six-signal ranking, archival search's
  hybrid), then kept only if it holds one of the topic's words (stemmed) or
  is close to it in meaning.
- `erasing.py`: deleting what was found everywhere it lives, rewriting the
  summaries that mention it, and the receipt.
"""
