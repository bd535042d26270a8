"""The LLM client, one package behind one call: `await LLMClient.complete(Request)`
gives a `Completion` (the answer in plain strings, with the server's `TokenUsage`)
or raises an `LLMUnavailableError` whose `user_message` a person can act on.

- types.py: the request, the completion and its usage, the errors; reading an
  answer (streamed, as far as the reply budget);
- client.py: the client (slots, time bounds), one request's run (send, repair,
  retry), and what it learns about its endpoint (refused parameters, repairs,
  the server's token ratio and context limit);
- shape.py: the request as every common server takes it, its repairs, its JSON;
- refusals.py: what a server's error means (a refusal to repair, or an outage).

What an agent does with the client (room before each step, summaries, metering)
is the agent's: bot/agent_calls.py.
"""

from bot.llm.client import LLMClient
from bot.llm.shape import tools_as_text
from bot.llm.types import LATE, Completion, ContextLimitError, LLMUnavailableError, Request, TokenUsage, trouble

__all__ = [
    "LATE",
    "Completion",
    "ContextLimitError",
    "LLMClient",
    "LLMUnavailableError",
    "Request",
    "TokenUsage",
    "tools_as_text",
    "trouble",
]
