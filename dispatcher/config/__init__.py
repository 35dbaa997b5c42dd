"""Configuration: the settings file and its environment overrides (`settings`), API tokens, the
signing secret, and how the connection budget is split."""
