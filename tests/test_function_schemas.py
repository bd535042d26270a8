"""The function schemas are part of every prompt: moving them around the code
must not change one byte of what the model is sent (nor the provider's prompt
cache). tests/golden/function_schemas.json is the tool list as it was built
before the schemas moved beside their bodies; change it only on purpose."""

from __future__ import annotations

import json
from pathlib import Path

from bot.checkins.functions import register_checkin_functions
from bot.functions.core import build_core_functions
from bot.functions.forget import register_forget_functions
from bot.functions.registry import MORE_FUNCTIONS, FunctionSet
from memory.schedules import CheckinPrefs, Schedule

GOLDEN = Path(__file__).parent / "golden" / "function_schemas.json"


class _NoSchedules:
    """register_checkin_functions only keeps the store for later calls."""

    async def get_prefs(self, agent_key: str) -> CheckinPrefs:
        raise AssertionError("not called while building the tool list")

    async def list_for_user(self, agent_key: str) -> list[Schedule]:
        raise AssertionError("not called while building the tool list")

    async def add(self, schedule: Schedule) -> Schedule:
        raise AssertionError("not called while building the tool list")


def runtime_functions() -> FunctionSet:
    functions = build_core_functions()
    register_forget_functions(functions)  # in the runtime's order
    register_checkin_functions(functions, _NoSchedules())  # type: ignore[arg-type]
    return functions


def test_the_tool_list_is_byte_identical_to_the_golden_copy() -> None:
    # Offered with every request, then the ones offered on demand (in that order once asked for).
    functions = runtime_functions()
    assert json.dumps(functions.schemas + functions.on_demand_schemas) == GOLDEN.read_text(encoding="utf-8")


def test_every_schema_is_registered_with_its_body() -> None:
    functions = runtime_functions()
    offered = [schema["function"]["name"] for schema in functions.schemas]
    on_demand = [schema["function"]["name"] for schema in functions.on_demand_schemas]
    assert sorted(offered + on_demand) == sorted(functions.names)
    assert len(set(offered + on_demand)) == len(offered + on_demand)
    # The rarely needed ones stand behind one short entry that names each of them, last of the offered.
    assert offered[-1] == MORE_FUNCTIONS and on_demand == [
        "conversation_search_date",
        "forget_memories",
        "schedule_reminder",
    ]
    description = functions.schemas[-1]["function"]["description"]
    assert all(name in description for name in on_demand)
    assert functions.on_demand_triggers == frozenset([*on_demand, MORE_FUNCTIONS])
