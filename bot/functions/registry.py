"""The machinery of the functions the model may call: schemas, validation
and dispatch. Each family of functions keeps its schemas beside its bodies
(bot/functions/core.py, bot/checkins/functions.py) and registers them here.

Names and arguments are a contract (see the agent core issue). Schemas are
written tersely because they are sent with every request. The functions few
messages need are registered `on_demand`: every request carries only one
short entry naming them (MORE_FUNCTIONS), and a conversation's requests carry
their schemas once it called that entry (or one of them), until a flush
(memory/queue_manager.py `more_tools`). Anything wrong with
a call (bad JSON, unknown name, arguments that fail the schema, an edit that
cannot be done) becomes a `FunctionError`, whose text goes back to the model.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from jsonschema import Draft202012Validator

from bot.sanitize import fix_surrogates_in

# The agent a function runs for (bot/agent.py): a type parameter, since the
# agent holds its function set (bot/services.py) and the machinery needs
# nothing of it but to hand it on.
AgentT = TypeVar("AgentT")

# Explained once, in the instructions (bot/prompts.py), not in every schema.
HEARTBEAT = {"type": "boolean"}
MORE_FUNCTIONS = "more_functions"
PAGE = {"type": "integer", "minimum": 0}


def function_schema(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


class FunctionError(Exception):
    """A call the model made that failed; the message is shown to the model."""


@dataclass(slots=True)
class FunctionOutcome:
    name: str
    ok: bool
    result: str
    heartbeat: bool


class ShownNow(str):
    """A function's result that the model reads now, while the agent's recall keeps
    `kept` in its place (bot/channels/recall.py: a channel's lines are readable only
    in that channel, and the agent's recall is read from its other places too)."""

    kept: str

    def __new__(cls, shown: str, kept: str) -> ShownNow:
        made = super().__new__(cls, shown)
        made.kept = kept
        return made


Implementation = Callable[[AgentT, dict[str, Any]], Awaitable[str]]


class FunctionSet(Generic[AgentT]):
    """Schemas plus implementations; validates and runs one call at a time."""

    def __init__(self) -> None:
        self.schemas: list[dict[str, Any]] = []  # offered with every request
        self.on_demand_schemas: list[dict[str, Any]] = []
        self._on_demand_uses: list[str] = []  # "name (what for)", as MORE_FUNCTIONS lists them
        self._validators: dict[str, Draft202012Validator] = {}
        self._implementations: dict[str, Implementation[AgentT]] = {}
        self._takes_heartbeat: set[str] = set()

    def register(self, schema: dict[str, Any], implementation: Implementation[AgentT], *, on_demand: str = "") -> None:
        """`on_demand`: what the function is for, in a few words; it is then
        offered only when the model asks (MORE_FUNCTIONS), but may be called any time."""
        name = schema["function"]["name"]
        strict = dict(schema["function"]["parameters"], additionalProperties=False)
        if on_demand:
            self.on_demand_schemas.append(schema)
            self._on_demand_uses.append(f"{name} ({on_demand})")
            self._offer_more()
        else:
            self.schemas.append(schema)
        self._validators[name] = Draft202012Validator(strict)
        self._implementations[name] = implementation
        if "request_heartbeat" in schema["function"]["parameters"]["properties"]:
            self._takes_heartbeat.add(name)

    def _offer_more(self) -> None:
        """The one entry standing for the on-demand functions, last of the offered ones."""
        entry = function_schema(
            MORE_FUNCTIONS, "Offer more functions: " + ", ".join(self._on_demand_uses) + ".", {}, []
        )
        self.schemas[:] = [s for s in self.schemas if s["function"]["name"] != MORE_FUNCTIONS] + [entry]
        if MORE_FUNCTIONS not in self._implementations:
            self._validators[MORE_FUNCTIONS] = Draft202012Validator({"type": "object"})
            self._implementations[MORE_FUNCTIONS] = self._more_functions

    async def _more_functions(self, agent: AgentT, arguments: dict[str, Any]) -> str:
        names = ", ".join(schema["function"]["name"] for schema in self.on_demand_schemas)
        return f"Offered from your next step on: {names}."

    @property
    def on_demand_triggers(self) -> frozenset[str]:
        """The functions whose result in a queue makes its requests offer the on-demand schemas."""
        names = {schema["function"]["name"] for schema in self.on_demand_schemas}
        return frozenset(names | {MORE_FUNCTIONS}) if names else frozenset()

    def known_name(self, name: str) -> str:
        """`name`, or the function it can only mean: small models wrap names in
        spaces, quotes or backticks, or prefix them with `functions.`."""
        if name in self._implementations:
            return name
        bare = name.strip().strip("`'\"").strip()
        bare = bare.removeprefix("functions.").removesuffix("()")
        return bare if bare in self._implementations else name

    @property
    def names(self) -> list[str]:
        return list(self._implementations)

    def parse(self, name: str, raw_arguments: str) -> dict[str, Any]:
        name = self.known_name(name)
        if name not in self._implementations:
            raise FunctionError(f"Unknown function {name!r}. Available: {', '.join(self.names)}.")
        try:
            arguments = json.loads(raw_arguments) if raw_arguments.strip() else {}
            if isinstance(arguments, str) and arguments.strip().startswith("{"):
                arguments = json.loads(arguments)  # the JSON object sent as a JSON string inside the string
        except json.JSONDecodeError as error:
            raise FunctionError(f"Arguments of {name} are not valid JSON ({error.msg} at {error.pos}).") from None
        if not isinstance(arguments, dict):
            raise FunctionError(f"Arguments of {name} must be a JSON object.")
        arguments = dict(fix_surrogates_in(_coerce_scalars(arguments)))  # a model may write "\ud800"
        if "request_heartbeat" not in arguments and name in self._takes_heartbeat:
            arguments["request_heartbeat"] = False  # left out: no heartbeat, as if it said false
        errors = sorted(self._validators[name].iter_errors(arguments), key=lambda e: list(e.path))
        if errors:
            details = "; ".join(_describe(error) for error in errors[:5])
            raise FunctionError(f"Invalid arguments for {name}: {details}.")
        return arguments

    async def run(self, agent: AgentT, name: str, raw_arguments: str) -> FunctionOutcome:
        name = self.known_name(name)
        try:
            arguments = self.parse(name, raw_arguments)
            result = await self._implementations[name](agent, arguments)
        except FunctionError as error:
            return FunctionOutcome(name, ok=False, result=str(error), heartbeat=True)
        # Asking for more functions always earns the step that uses them.
        heartbeat = bool(arguments.get("request_heartbeat")) or name == MORE_FUNCTIONS
        return FunctionOutcome(name, ok=True, result=result, heartbeat=heartbeat)


def _coerce_scalars(arguments: dict[str, Any]) -> dict[str, Any]:
    """Accept the near-misses small models often send ("true", "2")."""
    fixed = dict(arguments)
    value = fixed.get("request_heartbeat")
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        fixed["request_heartbeat"] = value.strip().lower() == "true"
    page = fixed.get("page")
    if isinstance(page, str) and page.strip().isdigit():
        fixed["page"] = int(page.strip())
    return fixed


def _describe(error: Any) -> str:
    where = ".".join(str(part) for part in error.path)
    if error.validator == "additionalProperties":
        return str(error.message).replace("Additional properties are not allowed", "unexpected argument(s)")
    return f"{where}: {error.message}" if where else str(error.message)
