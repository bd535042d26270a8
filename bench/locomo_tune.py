"""Fit conversation search's weights on the LoCoMo dev split, and check them.

Every signal of memory/search/conversation.py is computed once per question
(the production code: ConversationIndex.features, real MiniLM embeddings);
the weights are then fitted by coordinate ascent on recall@10 (Metzler and
Croft's method for a few features: each weight in turn set to the best value
of a grid, until nothing improves), with the meaning weight fixed at 1 (the
scale). Printed: the fitted weights, recall@10 with them and with the weights
in the code, leave-one-conversation-out recall@10 (fit on three, test on the
fourth: the estimate for held-out conversations), and an ablation that drops
one signal at a time (refitting the rest).

    python bench/locomo_tune.py [--data DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict, fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import numpy.typing as npt

from bench.locomo_data import DEFAULT_DATA, Conversation, load
from memory.embeddings import Embedder
from memory.search.conversation import WEIGHTS, ConversationIndex

NAMES = [field.name for field in fields(WEIGHTS)]
GRID = [0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.2, 1.5]
K = 10

# One question: its signals (one row per name) and the positions of its evidence.
Sample = tuple[npt.NDArray[np.float64], list[int]]


def samples(conversation: Conversation, embedder: Embedder) -> list[Sample]:
    messages = conversation.messages()
    for seq, message in enumerate(messages, start=1):
        message.seq = seq
    vectors = embedder.encode_now([m.content or "" for m in messages])
    questions = embedder.encode_now([q.text for q in conversation.questions])
    index = ConversationIndex()
    index.add(messages, {m.seq: vectors[n] for n, m in enumerate(messages)})
    position = {turn.dia_id: n for n, turn in enumerate(conversation.turns)}
    out = []
    for question, vector in zip(conversation.questions, questions, strict=True):
        signals = index.features(question.text, vector)
        out.append(
            (np.stack([signals[name] for name in NAMES]).astype(np.float64), [position[e] for e in question.evidence])
        )
    return out


def recall(data: list[Sample], weights: npt.NDArray[np.float64]) -> float:
    total = 0.0
    for signals, evidence in data:
        score = weights @ signals
        # Ties to the lower position, as the ranking breaks them by seq.
        top = set(np.lexsort((np.arange(len(score)), -score))[:K].tolist())
        total += sum(1 for e in evidence if e in top) / len(evidence)
    return total / len(data)


def fit(data: list[Sample], start: npt.NDArray[np.float64], frozen: set[str]) -> tuple[npt.NDArray[np.float64], float]:
    weights = start.copy()
    best = recall(data, weights)
    for _ in range(4):
        improved = False
        for j, name in enumerate(NAMES):
            if name == "meaning" or name in frozen:
                continue
            for value in GRID:
                trial = weights.copy()
                trial[j] = value
                score = recall(data, trial)
                if score > best + 1e-9:
                    weights, best, improved = trial, score, True
        if not improved:
            break
    return weights, best


def cross_validated(per_conversation: list[list[Sample]], start: npt.NDArray[np.float64], frozen: set[str]) -> float:
    hits, count = 0.0, 0
    for held_out in range(len(per_conversation)):
        train = [s for n, data in enumerate(per_conversation) if n != held_out for s in data]
        weights, _ = fit(train, start, frozen)
        test = per_conversation[held_out]
        hits += recall(test, weights) * len(test)
        count += len(test)
    return hits / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args()
    embedder = Embedder()
    per_conversation = [samples(c, embedder) for c in load(args.data)]
    everything = [s for data in per_conversation for s in data]
    current = np.array([asdict(WEIGHTS)[name] for name in NAMES])

    fitted, best = fit(everything, current, set())
    print("weights in the code: ", dict(zip(NAMES, current.round(3).tolist(), strict=True)))
    print(f"recall@10 with them:  {recall(everything, current):.3f}")
    print("fitted on all four:  ", dict(zip(NAMES, fitted.round(3).tolist(), strict=True)), f"recall@10 {best:.3f}")
    print(f"leave one conversation out (fit on 3, test on 1): {cross_validated(per_conversation, current, set()):.3f}")
    print("\nablation (the signal's weight at 0, the others refitted):")
    for name in NAMES[1:]:
        start = current.copy()
        start[NAMES.index(name)] = 0.0
        _, score = fit(everything, start, {name})
        held_out = cross_validated(per_conversation, start, {name})
        print(f"  without {name:<13} recall@10 {score:.3f}   cross-validated {held_out:.3f}")


if __name__ == "__main__":
    main()
