"""The API token format: `TOKEN [SCOPE,...] [# NAME]` per line of the tokens file, per item of
`api_tokens`, per `;`-separated entry of DISPATCHER_API_TOKENS. A bare token keeps full access;
every error names the line or entry and never the token."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.config.settings import load_settings
from dispatcher.config.tokens import SCOPES, TokenError, parse_file, split_environment
from dispatcher.errors import ConfigError

SECRET = "tok-9f3e1c77a0b2"
FILE = f"""
# operators of the platform team
{SECRET} read,operate # oncall
tok-ci-55e0 enqueue   # ci deployer
tok-legacy-0001

tok-dash-77 read
"""


def test_a_file_names_and_scopes_every_token() -> None:
    tokens = parse_file(FILE, "api_tokens_file")
    assert [(t.name, sorted(t.scopes), t.where) for t in tokens] == [
        ("oncall", ["operate", "read"], "api_tokens_file line 3"),
        ("ci deployer", ["enqueue"], "api_tokens_file line 4"),
        ("api_tokens_file line 5", sorted(SCOPES), "api_tokens_file line 5"),
        ("api_tokens_file line 7", ["read"], "api_tokens_file line 7"),
    ]
    assert tokens[0].secret == SECRET
    assert SECRET not in repr(tokens[0])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (f"{SECRET} read,opreate", "line 2: scope 2 of 2 is not one of read, enqueue, operate"),
        (f"{SECRET} read, operate", "line 2: expected TOKEN [SCOPE,SCOPE,...] [# NAME]"),
        (f"{SECRET} read enqueue", "line 2: expected TOKEN"),
        (f"{SECRET},tok-b", "line 2: a token may not contain ',' or ';'"),
        (f"{SECRET} read #", "line 2: the name after '#' must be 1 to 64 printable characters"),
        (f"{SECRET} read # {'n' * 65}", "line 2: the name after '#' must be 1 to 64"),
        ("operate", "line 2: the token is a scope name"),
        (f"{SECRET} {SECRET}", "line 2: scope 1 of 1 is not one of"),
    ],
)
def test_a_bad_line_is_named_and_the_token_never_echoed(line: str, message: str) -> None:
    with pytest.raises(TokenError) as caught:
        parse_file(f"# tokens\n{line}\n", "api_tokens_file")
    assert str(caught.value).startswith(f"api_tokens_file {message}"), str(caught.value)
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    ("value", "entries"),
    [
        (" tok-a, tok-b,,tok-c ", ["tok-a", "tok-b", "tok-c"]),  # as before scopes
        ("tok-a read,enqueue", ["tok-a read,enqueue"]),
        ("tok-a read,enqueue;tok-b # ops;tok-c", ["tok-a read,enqueue", "tok-b # ops", "tok-c"]),
        ("tok-a read\ntok-b operate\n", ["tok-a read", "tok-b operate"]),
        # a comma after a scoped entry is a scope separator, never a new full-access token
        ("tok-a read,tok-b", ["tok-a read,tok-b"]),
    ],
)
def test_environment_entries(value: str, entries: list[str]) -> None:
    assert split_environment(value) == entries


def test_environment_tokens_with_scopes_load() -> None:
    settings = load_settings(None, {"DISPATCHER_API_TOKENS": "tok-a read,enqueue # ci;tok-b"})
    views = [t.public_view() for t in settings.api_token_entries()]
    assert views == [
        {"name": "ci", "scopes": ["enqueue", "read"], "from": "api_tokens[1]"},
        {"name": "api_tokens[2]", "scopes": sorted(SCOPES), "from": "api_tokens[2]"},
    ]
    assert settings.all_api_tokens() == ["tok-a", "tok-b"]
    assert settings.public_view()["api_token_scopes"] == views


def config_error(env: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, env)
    return str(caught.value)


def test_a_bad_tokens_file_is_a_config_error_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"tok-a read\n\n{SECRET} reed # ops\n")
    message = config_error({"DISPATCHER_API_TOKENS_FILE": str(path)})
    assert message == (
        "api_tokens_file line 3: scope 1 of 1 is not one of read, enqueue, operate "
        "(commas between scopes, no spaces)"
    )
    path.write_text(f"{SECRET} read # a\n{SECRET} operate # b\n")
    message = config_error({"DISPATCHER_API_TOKENS_FILE": str(path)})
    assert (
        message
        == "api_tokens_file line 2: the same token as api_tokens_file line 1; keep one entry"
    )
    path.write_text("tok-a read # ops\ntok-b operate # ops\n")
    message = config_error({"DISPATCHER_API_TOKENS_FILE": str(path)})
    assert "line 2: the name 'ops' is also used by api_tokens_file line 1" in message


def test_a_bad_environment_entry_is_a_config_error_without_the_token() -> None:
    message = config_error({"DISPATCHER_API_TOKENS": f"{SECRET} read,{SECRET}"})
    assert message.startswith("api_tokens[1]: scope 2 of 2 is not one of")
    assert SECRET not in message
