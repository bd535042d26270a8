"""Crash safety: the durable-event pipeline (inbox, outbox, redelivery) and
the per-user lane. A SIGKILL may land anywhere in it; what happened to an
event or a reply is in its database row, never only in this process's memory.

1. RECEIVE. An adapter records each platform event in the inbox
   (Inbox.receive, through the bot's port) before it acknowledges it; a repeat
   delivery of a recorded event is acknowledged and dropped. The events built
   from it carry its inbox id (Event.inbox_id).
2. RUN. When the runtime starts work on an event (its user's lane, lease and
   lock held) the row becomes *running* (Inbox.started). The agent records
   the event's message in recall storage tagged with the event id, and every
   reply it sends in the outbox with the step's record (Agent.send, then
   record_messages: one store call) before the step goes on. Redone
   after a crash, an event whose message is there is not recorded again; one
   that was answered is not answered again: only its unconfirmed replies are
   handed back (Agent._answered_before_a_crash).
3. DELIVER. The adapter sends the replies through its lanes (lanes.py: one
   delivery order per person) and reports each (Outbox.report): sent, to
   retry later with backoff (also when held behind an earlier reply to the
   same person that waits for its retry), or undeliverable (dropped with a
   log line). It marks the event done (Inbox.finished) beside the report of
   its last reply, once that reply was sent (adapters/pipeline.py).
4. STORAGE DOWN (bot/door.py: StoreWait). An event that meets a store fault is redone
   whole with backoff for up to MEMGPT_STORE_WAIT; then its row becomes
   *waiting*, with its next try (Inbox.wait_for_storage), and `finished`
   leaves it so. Should storage refuse even that write, the mark is kept
   aside and written at the next redelivery round.
5. REDELIVER (redelivery.py). Every few seconds: the outbox's due replies are
   sent, and the waiting events that are due (their time came, or storage
   answered another event) are claimed (back to pending) and handed to their
   adapter's `replay`, which handles them like new ones, in order.
6. RESTART. Before new work, each adapter replays every unfinished event of
   its platform in arrival order (Inbox.leftovers). Only a row found
   *running* counts a restart against its event; at MAX_RESTARTS it is given
   up: the person is told (Redo.notice) and an error is logged, never a
   silent drop. Events that were running when the process died are suspects
   until they finish: they run one at a time, alone (inbox.py: Quarantine), so a
   death while one runs is that one event's, and a poison event cannot take
   the others down with it. A reply that reached the platform just before a crash comes
   back marked `resend`: the adapter looks for it on the platform before
   sending it again (Slack: message metadata; Discord: nonce).

DEBOUNCE (debounce.py). A person's quick messages in one place are one event:
the followers are linked to their leader in the inbox (Inbox.started)
before all their messages are recorded in one write, each under its own id;
the leader's run answers them all. A follower redone after a crash is
finished without an answer if its batch recorded it, else handled alone.

Several bot processes on one database (leases.py): one works on an agent at a
time, in arrival order.
"""
