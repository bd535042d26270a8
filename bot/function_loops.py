"""A function loop in one event's chain of steps (bot/agent.py), which ends the chain
at once; the last request then answers the person (bot/agent_calls.py: plain_answer):

- a step repeats a call of the chain, the same function with the same arguments
  (whatever their spacing or key order): it would get the same result, and is not run;
- a function fails on FAILED_STEPS_IN_A_ROW steps in a row: a small model retries it with
  other bad arguments up to the step cap (SmolLM2 through llama-cpp-python:
  core_memory_append and core_memory_replace on blocks named after words of the message,
  eight steps of three requests each, every message). Fewer would cut off a model that
  reads the errors and corrects itself (a reminder's time on the fourth try);
- a function fails on two steps in a row with the same error, the values it quotes aside:
  the model did not act on what the first said (SmolLM2 asked for blocks "user", "Dana",
  "dana" step after step, told each time the blocks are persona, human and private),
  so its next try is no better;
- a search finds what a search of the chain found before, its query's words aside (SmolLM2
  searched archival storage with garbled queries up to the step cap, every search
  showing the same few passages): the model has learned all it will;
- after a chain that looped (or ran to the step cap), the agent's next chain ends at its
  first failed step: a model that looped once mostly loops again (SmolLM2's
  core_memory_replace failed twice a message, every message, two requests a step on
  llama-cpp-python), and its retries cost a step each. One chain that ends by itself
  gives the model its retries back.

Made only once a chain goes past its first step: the usual one-step answer never comes here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from bot.llm import Completion

FAILED_STEPS_IN_A_ROW = 4
SEARCHES = frozenset({"archival_memory_search", "conversation_search", "conversation_search_date"})
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|\d+")


def _calls(completion: Completion) -> set[tuple[str, str]]:
    return {(call.name, _same_arguments(call.arguments)) for call in completion.tool_calls}


def _same_arguments(arguments: str) -> str:
    """A call's arguments as one text whatever their spacing or key order (a model's repeat
    differs in those); as they are when they are not JSON."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True)
    except ValueError:
        return arguments


def _kind(error: str) -> str:
    """An error without the values it quotes: "No memory block named 'Dana'" and "... 'dana'"
    are one mistake made again."""
    return _QUOTED.sub("", error)


def _hits(result: str) -> str:
    """A search's result without what depends on its query: the lines under its header
    (bot/functions/core.py: _page_text) without their scores, or a header alone
    ("Nothing found for ...") without the query."""
    header, _, hits = result.partition("\n")
    return _kind(hits or header)


class FunctionLoops:
    def __init__(self, *, after_a_loop: bool = False) -> None:
        self.after_a_loop = after_a_loop  # the agent's last chain looped: no retry after a failure
        self.made: set[tuple[str, str]] = set()  # the chain's calls (name, arguments)
        self.failing: dict[str, int] = {}  # a function that failed on the last step: steps in a row
        self.errors: Mapping[str, str] = {}  # what each function that failed on the last step said
        self.found: set[str] = set()  # what the chain's searches found, their queries' words aside

    def repeated(self, completion: Completion) -> str:
        """What of `completion`'s calls the chain made before ("": nothing)."""
        again = self.made & _calls(completion)
        return f"{min(again)[0]} called again with the same arguments" if again else ""

    def ran(self, completion: Completion, results: Mapping[str, tuple[bool, str]]) -> str:
        """A step ran `completion`'s calls, each with its `results` (ok, what it said): what has
        failed on too many steps in a row, or as before, or found nothing new ("": nothing)."""
        self.made |= _calls(completion)
        failed = {name: result for name, (ok, result) in results.items() if not ok}
        self.failing = {name: self.failing.get(name, 0) + 1 for name in failed}
        kinds = {name: _kind(error) for name, error in failed.items()}
        same = sorted(name for name, kind in kinds.items() if self.errors.get(name) == kind)
        self.errors = kinds
        if same:
            return f"{same[0]} failed again with the same error"
        if failed and self.after_a_loop:
            return f"{min(failed)} failed, after a chain that looped"
        again = sorted(name for name, steps in self.failing.items() if steps >= FAILED_STEPS_IN_A_ROW)
        if again:
            return f"{again[0]} failed on {FAILED_STEPS_IN_A_ROW} steps in a row"
        found = {name: _hits(result) for name, (ok, result) in results.items() if ok and name in SEARCHES}
        stale = sorted(name for name, kind in found.items() if kind in self.found)
        self.found |= set(found.values())
        return f"{stale[0]} found nothing new" if stale else ""
