"""The paper's retrieval harnesses, end to end through the real Runtime with
the local scripted model: multi-hop chaining by heartbeats, paging, and the
retrieval-only measure."""

from __future__ import annotations

import json

from bench import doc_qa, nested_kv
from tests.conftest import RuntimeFactory
from tests.fake_llm import FakeLLMServer


def test_task_has_140_pairs_and_every_chain_resolves() -> None:
    task = nested_kv.make_task(seed=11)
    assert len(task.pairs) == nested_kv.PAIRS == 140
    table = dict(task.pairs)
    assert len(table) == 140  # keys are distinct
    assert sorted({c.level for c in task.chains}) == [0, 1, 2, 3, 4]
    for chain in task.chains:
        key = chain.keys[0]
        for _ in range(chain.level + 1):
            key = table[key]
        assert key == chain.answer and chain.answer not in table
    assert nested_kv.make_task(seed=11).pairs == task.pairs  # seeded


async def test_nested_kv_through_the_agent_follows_every_chain(
    make_runtime: RuntimeFactory, llm_server: FakeLLMServer
) -> None:
    llm_server.set_handler(nested_kv.scripted_reply)
    # Level 4 takes 5 lookups, 1 look at page 1 for the last value, and the reply.
    # A 32k window: in 8k, ten questions of chained searches fill the queue, and
    # pages taken near a flush are shortened until the UUIDs are cut off.
    runtime = await make_runtime(max_steps_per_event=12, context_window=32_768)
    task = nested_kv.make_task(seed=1, per_level=2)
    scores = await nested_kv.run_agent(runtime, task, per_level=2)
    assert sorted(scores) == [0, 1, 2, 3, 4]
    for level, score in scores.items():
        assert (score.chains, score.chains_found) == (2, 2), level
        # One search per hop, then the final value is searched once more on
        # page 0 and page 1 before it is taken as no key.
        assert score.searches == [level + 3] * 2
        assert score.pages == [level + 3] * 2
    # Chained by heartbeats: every follow-up request carries the previous result.
    follow_ups = [r for r in llm_server.requests if r["messages"][-1]["role"] == "tool"]
    assert follow_ups and all(json.loads(r["messages"][-1]["content"])["status"] == "OK" for r in follow_ups)
    assert any("call again with page=1" in r["messages"][-1]["content"] for r in follow_ups)


async def test_nested_kv_retrieval_only_by_level(make_runtime: RuntimeFactory) -> None:
    runtime = await make_runtime()
    task = nested_kv.make_task(seed=2, per_level=3)
    agent_id = await nested_kv.load_task(runtime, "bench:kv", task)
    scores = await nested_kv.retrieval_only(runtime.archival, agent_id, task)
    assert sorted(scores) == [0, 1, 2, 3, 4]
    for level, score in scores.items():
        assert score.hops == 3 * (level + 1)
        assert score.hops_found == score.hops, (level, score)
    # Keywords alone cannot tell the passage holding a key from the one whose
    # value it is: they tie, and the tie goes by id.
    keyword = await nested_kv.retrieval_only(runtime.archival, agent_id, task, "keyword")
    assert sum(s.hops_found for s in keyword.values()) < sum(s.hops for s in keyword.values())


async def test_doc_qa_through_the_agent(make_runtime: RuntimeFactory, llm_server: FakeLLMServer) -> None:
    llm_server.set_handler(doc_qa.scripted_reply)
    runtime = await make_runtime(max_steps_per_event=6)
    documents, questions = doc_qa.read_collection(None, None)
    report = await doc_qa.run_agent(runtime, documents, questions)
    assert len(report.results) == len(questions)
    # The scripted model answers with the top passage of page 0: this measures
    # that hybrid search puts the passage holding the answer first.
    assert report.accuracy >= 0.8, [(r.question, r.reply[:80]) for r in report.results if not r.correct]
    assert all(r.searches == 2 and r.pages == 2 for r in report.results)  # read page 0, then page 1
    assert all(r.steps == 3 for r in report.results)
