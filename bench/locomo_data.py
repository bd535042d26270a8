"""The LoCoMo development split as recall messages and questions.

Read from ../shared/data/locomo-dev (beside the repository, never copied into
it: the data is CC BY-NC). Turns become messages as the split's README says:
role user for speaker_a and assistant for speaker_b, content "Speaker: text"
with a shared image's caption appended as "[shares an image: ...]", timestamp =
the session's time + 30 s per turn.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from memory.types import Message

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "locomo-dev"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}


@dataclass(frozen=True, slots=True)
class Turn:
    dia_id: str
    role: str
    content: str
    at: datetime


@dataclass(frozen=True, slots=True)
class Question:
    text: str
    category: int
    evidence: tuple[str, ...]  # dia_ids of the turns that answer it (only those that exist)
    answer: str = ""  # the reference answer (bench/qa.py scores against it)


@dataclass(frozen=True, slots=True)
class Conversation:
    name: str
    turns: tuple[Turn, ...]
    questions: tuple[Question, ...]

    def messages(self) -> list[Message]:
        return [Message(role=t.role, content=t.content, name="imported", created_at=t.at) for t in self.turns]  # type: ignore[arg-type]


def session_time(text: str) -> datetime:
    """ "1:56 pm on 8 May, 2023" as a UTC datetime."""
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def _turns(conversation: dict[str, object]) -> list[Turn]:
    speaker_a = conversation["speaker_a"]
    sessions = sorted(
        (int(match.group(1)), key)
        for key in conversation
        if (match := re.fullmatch(r"session_(\d+)", key)) and conversation[key]
    )
    turns: list[Turn] = []
    for number, key in sessions:
        start = session_time(str(conversation[f"session_{number}_date_time"]))
        for n, raw in enumerate(conversation[key]):  # type: ignore[arg-type]
            content = f"{raw['speaker']}: {raw['text']}"
            if raw.get("blip_caption"):
                content += f" [shares an image: {raw['blip_caption']}]"
            role = "user" if raw["speaker"] == speaker_a else "assistant"
            turns.append(Turn(raw["dia_id"], role, content, start + timedelta(seconds=30 * n)))
    return turns


def load(data_dir: Path = DEFAULT_DATA) -> list[Conversation]:
    raw = json.loads((data_dir / "locomo-dev.json").read_text(encoding="utf-8"))
    conversations = []
    for item in raw:
        turns = _turns(item["conversation"])
        known = {turn.dia_id for turn in turns}
        questions = []
        for qa in item["qa"]:
            if qa.get("category") not in CATEGORIES:
                continue
            # Evidence ids are sometimes joined ("D8:6; D9:17"); an id naming no
            # turn (a typo in the data) cannot be found and is left out.
            ids = [part for entry in qa["evidence"] for part in re.split(r"[;,\s]+", entry) if part in known]
            if ids:
                evidence = tuple(dict.fromkeys(ids))
                questions.append(
                    Question(str(qa["question"]), int(qa["category"]), evidence, str(qa.get("answer", "")))
                )
        conversations.append(Conversation(item["sample_id"], tuple(turns), tuple(questions)))
    return conversations
