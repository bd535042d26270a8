"""Group memory: what a channel says, kept for that channel with each member's consent.

`port.py` is what adapters may ask (a channel's mode, a line heard, edited or
deleted); the rest joins the adapters' channel lines to memory/channels.py's
ChannelMemory: modes, consent, the channel's notes, retention.
"""
