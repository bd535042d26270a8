"""The last module the tests' fork server (tests/forks.py) preloads: what every
forked bot or CLI would otherwise build again at each start, then the heap frozen.

- The token encoders the tests' bots count with (about 0.2 s of CPU per start).
- gc.freeze(): a started bot runs gc.collect() once and freezes its heap
  (cli/common.py, freeze_start_up_heap). In a child forked from here that
  pass walked every object the server imported (torch, transformers), about
  0.6 s of CPU per start and a copy of each page it touched. Frozen here, the
  children's collections skip them: what a pre-forking server does.
"""

from __future__ import annotations

import dataclasses
import gc

from bot.config import Settings
from memory.tokens import load_encoder

DEFAULTS = {field.name: field.default for field in dataclasses.fields(Settings)}

# The test settings' model (tests/conftest.py, the harnesses) and the default
# one, called as the runtime calls it (the cache is keyed by the arguments).
for model in ("test-model", str(DEFAULTS["model"])):
    load_encoder(model, str(DEFAULTS["fallback_encoding"]))

gc.collect()
gc.freeze()
