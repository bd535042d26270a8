"""Slash commands, written once: each platform parses its payload into a
command's options (`SlashCommand.parse` for a line of text) and a `Caller`,
calls `run` (or `press` for a button) and renders the `Answer`; the work is
the bot's, through the command port (bot/commands/port.py).

A new command is one `SlashCommand` in catalog.py's COMMANDS (and, for its
buttons, an `Action` in ACTIONS): the adapters register and render whatever
is there."""
