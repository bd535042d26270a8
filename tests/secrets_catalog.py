"""Every fake secret the test suite configures, in one place.

Tests configure tokens, keys and passwords from these constants, and
`scripts/scan_logs_for_secrets.py` greps a test session's logs for all of
them (see tests/log_capture.py): a secret that reaches a log line anywhere in
the suite fails CI, whichever test happened to leak it.

Values are long and distinctive, so a hit is never a coincidence. They carry
the prefixes the real ones have (Slack checks xoxb-/xapp-), because a
redaction that keys on a prefix must be tested against realistic shapes.
"""

from __future__ import annotations

# -- the bot's secret settings (bot/config.py, adapters' configs) ---------------
OPENAI_API_KEY = "sk-memgpt-test-openai-7f3c9d2e4b1a"
DISCORD_TOKEN = "MTAxNzA0NjY4.memgpt-test.discord-token-5e8a2c"
SLACK_BOT_TOKEN = "xoxb-memgpt-test-bot-token-91c4f6"
SLACK_APP_TOKEN = "xapp-1-memgpt-test-app-token-2d7b05"
SLACK_SIGNING_SECRET = "memgpt-test-signing-secret-4a6e1f"
MONGODB_PASSWORD = "memgpt-test-mongo-pw-8c3e57"
MONGODB_URI = f"mongodb://memgpt:{MONGODB_PASSWORD}@127.0.0.1:1/memgpt?authSource=admin"

# A second, *wrong* credential of each kind: what a person pastes by mistake
# is just as secret as the right one, and is what error paths handle.
WRONG_OPENAI_API_KEY = "sk-memgpt-test-wrong-key-3b9e01"
WRONG_SLACK_BOT_TOKEN = "xoxb-memgpt-test-wrong-bot-6f2a93"
WRONG_SLACK_APP_TOKEN = "xapp-1-memgpt-test-wrong-app-0c5d78"
WRONG_DISCORD_TOKEN = "MTAxNzA0NjY4.memgpt-test.wrong-discord-1d9b4e"

# -- values other tests and fakes configure ------------------------------------
CLI_OPENAI_API_KEY = "sk-cli-test-secret-4242"  # tests/test_cli.py
SLACK_TEST_SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"  # tests/test_slack_adapter.py
FAKE_SLACK_BOT_TOKEN = "xoxb-fake-bot-token"  # tests/fake_slack.py defaults
FAKE_SLACK_APP_TOKEN = "xapp-fake-app-token"
FAKE_LLM_API_KEY = "sk-fake-llm"  # tests/fake_llm.py
CONFIG_TEST_API_KEY = "sk-secret-123"  # tests/test_config.py
CONFIG_TEST_MONGODB_PASSWORD = "pw-secret-456"

# Label -> value, for the scanner (labels are printed, values never are).
SECRETS: dict[str, str] = {
    name: value
    for name, value in sorted(globals().items())
    if name.isupper() and isinstance(value, str) and name not in ("MONGODB_URI",)
}
