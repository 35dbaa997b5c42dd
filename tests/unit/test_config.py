"""Configuration: TOML file plus `DISPATCHER_*` overrides; one line per bad setting; no secret ever
printed; a non-loopback API without tokens refused."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest

from dispatcher.config.settings import Settings, load_settings
from dispatcher.errors import ConfigError

SECRET_URL = "postgresql://app:hunter2-db-pass@db.internal:5432/jobs"
SIGNING_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
# off loopback, tokens need 32 characters or more
TOKENS = ("tok-alpha-5b1e-6f0a1d33c8e94b27a1c0", "tok-beta-77c2-0d4e9a7f2b3c6e1d8a55")
LONG = "t1-" + "7" * 40


def write(tmp_path: Path, text: str, name: str = "dispatcher.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def config_error(path: Path | None = None, **env: str) -> str:
    with pytest.raises(ConfigError) as raised:
        load_settings(path, env)
    return str(raised.value)


# sources and precedence -------------------------------------------------------------------------
def test_defaults_without_file_or_environment() -> None:
    s = load_settings(None, {})
    assert s.database_url is None
    assert s.state_dir == Path("var")
    assert s.listen == "127.0.0.1:8080"
    assert s.all_api_tokens() == []
    assert s.target_allow_cidrs == []
    assert s.target_allow_http is False
    assert s.drain_timeout_s == 30.0
    assert s.body_limit_bytes == 256 * 1024
    assert list(s.queues) == ["default"]


def test_toml_file_then_environment_overrides_it(tmp_path: Path) -> None:
    path = write(
        tmp_path, 'drain_timeout_s = 10\nlisten = "127.0.0.1:9000"\nbody_limit_bytes = 4096\n'
    )
    s = load_settings(path, {"DISPATCHER_DRAIN_TIMEOUT_S": "2.5"})
    assert s.drain_timeout_s == 2.5  # env wins
    assert s.listen == "127.0.0.1:9000"  # file kept where env is silent
    assert s.body_limit_bytes == 4096


def test_config_path_from_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "scan_batch = 77\n")
    assert load_settings(None, {"DISPATCHER_CONFIG": str(path)}).scan_batch == 77
    # an explicit path (the --config option) beats DISPATCHER_CONFIG
    other = write(tmp_path, "scan_batch = 12\n", "other.toml")
    assert load_settings(other, {"DISPATCHER_CONFIG": str(path)}).scan_batch == 12


def test_nested_override_merges_with_the_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[queues.default]\nburst = 7\n[queues.bulk]\nmax_inflight = 3\n",
    )
    s = load_settings(
        path,
        {
            "DISPATCHER_QUEUES__DEFAULT__RATE_PER_S": "50",
            "DISPATCHER_QUEUES__BULK__MAX_INFLIGHT": "9",
        },
    )
    assert s.queues["default"].rate_per_s == 50.0
    assert s.queues["default"].burst == 7
    assert s.queues["bulk"].max_inflight == 9


def test_nested_override_without_a_file() -> None:
    s = load_settings(
        None,
        {
            "DISPATCHER_QUEUES__DEFAULT__RATE_PER_S": "12.5",
            "DISPATCHER_HTTP__DEFAULT_TIMEOUT_S": "5",
        },
    )
    assert s.queues["default"].rate_per_s == 12.5
    assert s.queues["default"].burst == 1000  # the rest keeps its defaults
    assert s.http.default_timeout_s == 5.0


def test_lists_from_comma_separated_environment() -> None:
    s = load_settings(
        None,
        {
            "DISPATCHER_API_TOKENS": " tok-a, tok-b,,tok-c ",
            "DISPATCHER_TARGET_ALLOW_CIDRS": "127.0.0.0/8, ::1/128",
        },
    )
    assert s.all_api_tokens() == ["tok-a", "tok-b", "tok-c"]
    assert s.target_allow_cidrs == [
        ipaddress.ip_network("127.0.0.0/8"),
        ipaddress.ip_network("::1/128"),
    ]


@pytest.mark.parametrize(
    ("env", "value", "read"),
    [
        ("DISPATCHER_DATABASE_URL", SECRET_URL, lambda s: s.database_url.get_secret_value()),
        ("DISPATCHER_STATE_DIR", "/srv/dispatcher", lambda s: str(s.state_dir)),
        ("DISPATCHER_LISTEN", "127.0.0.1:9123", lambda s: s.listen),
        ("DISPATCHER_API_TOKENS", "tok-1", lambda s: ",".join(s.all_api_tokens())),
        ("DISPATCHER_TARGET_ALLOW_CIDRS", "10.0.0.0/8", lambda s: str(s.target_allow_cidrs[0])),
        ("DISPATCHER_TARGET_ALLOW_HTTP", "true", lambda s: str(s.target_allow_http).lower()),
        ("DISPATCHER_DRAIN_TIMEOUT_S", "45", lambda s: f"{s.drain_timeout_s:.0f}"),
        ("DISPATCHER_BODY_LIMIT_BYTES", "1048576", lambda s: str(s.body_limit_bytes)),
    ],
    ids=lambda v: v if isinstance(v, str) and v.startswith("DISPATCHER_") else "",
)
def test_every_public_environment_variable_applies(env: str, value: str, read: Any) -> None:
    assert read(load_settings(None, {env: value})) == value


@pytest.mark.parametrize(
    ("level", "fmt"), [("warning", "JSON"), ("Warning", "Json"), ("WARNING", "json")]
)
def test_log_level_and_format_in_any_case(level: str, fmt: str) -> None:
    s = load_settings(None, {"DISPATCHER_LOG_LEVEL": level, "DISPATCHER_LOG_FORMAT": fmt})
    assert (s.log_level, s.log_format) == ("WARNING", "json")


def test_unrelated_environment_is_ignored() -> None:
    s = load_settings(None, {"PATH": "/usr/bin", "DISPATCHERX": "1", "HOME": "/root"})
    assert s == Settings()


# bad values: one line naming the setting, the value and what is allowed -------------------------
@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"DISPATCHER_DRAIN_TIMEOUT_S": "-1"},
            ["drain_timeout_s", "'-1'", "greater than or equal to 0", "DISPATCHER_DRAIN_TIMEOUT_S"],
        ),
        ({"DISPATCHER_DRAIN_TIMEOUT_S": "soon"}, ["drain_timeout_s", "'soon'", "valid number"]),
        ({"DISPATCHER_LOG_LEVEL": "LOUD"}, ["log_level", "'LOUD'", "'DEBUG'", "'ERROR'"]),
        ({"DISPATCHER_LISTEN": "8080"}, ["listen", "'8080'", "host:port"]),
        ({"DISPATCHER_LISTEN": "127.0.0.1:99999"}, ["listen", "99999", "host:port"]),
        (
            {"DISPATCHER_BODY_LIMIT_BYTES": "12"},
            ["body_limit_bytes", "'12'", "greater than or equal to 1024"],
        ),
        ({"DISPATCHER_TARGET_ALLOW_HTTP": "maybe"}, ["target_allow_http", "'maybe'", "boolean"]),
        (
            {"DISPATCHER_TARGET_ALLOW_CIDRS": "10.0.0.0/8,banana"},
            [
                "target_allow_cidrs",
                "'banana'",
                "IPv4 network",
                "IPv6 network",
                "DISPATCHER_TARGET_ALLOW_CIDRS)",
            ],
        ),
        (
            {"DISPATCHER_QUEUES__DEFAULT__RATE_PER_S": "0"},
            [
                "queues.default.rate_per_s",
                "'0'",
                "greater than 0",
                "DISPATCHER_QUEUES__DEFAULT__RATE_PER_S",
            ],
        ),
        (
            {"DISPATCHER_QUEUES__DEFAULT__RATE_PR_S": "5"},
            ["queues.default.rate_pr_s", "unknown setting", "rate_per_s"],
        ),
        (
            {"DISPATCHER_DRAIN_TIMOUT_S": "5"},
            ["drain_timout_s", "unknown setting", "drain_timeout_s"],
        ),
    ],
    ids=lambda v: "-".join(f"{k}={w}" for k, w in v.items()) if isinstance(v, dict) else "",
)
def test_a_bad_value_is_one_line_naming_setting_value_and_what_is_allowed(
    env: dict[str, str], expected: list[str]
) -> None:
    message = config_error(**env)
    assert "\n" not in message
    for part in expected:
        assert part in message


def test_a_bad_value_in_the_file_names_the_setting_and_its_env_override(tmp_path: Path) -> None:
    path = write(tmp_path, "[queues.default]\nburst = 0\n")
    message = config_error(path)
    assert message == (
        "setting queues.default.burst = 0: Input should be greater than or equal to 1 "
        f"(in {path}; env DISPATCHER_QUEUES__DEFAULT__BURST overrides it)"
    )


def test_a_bad_value_from_the_environment_says_so(tmp_path: Path) -> None:
    path = write(tmp_path, "[queues.default]\nburst = 5\n")
    message = config_error(path, DISPATCHER_QUEUES__DEFAULT__BURST="0")
    assert message == (
        "setting queues.default.burst = '0': Input should be greater than or equal to 1 "
        "(from env DISPATCHER_QUEUES__DEFAULT__BURST)"
    )


def test_each_bad_setting_gets_its_own_line() -> None:
    lines = config_error(DISPATCHER_DRAIN_TIMEOUT_S="-1", DISPATCHER_SCAN_BATCH="0").splitlines()
    assert len(lines) == 2
    assert {line.split()[1] for line in lines} == {"drain_timeout_s", "scan_batch"}


def test_unreadable_or_invalid_toml(tmp_path: Path) -> None:
    missing = tmp_path / "absent.toml"
    assert config_error(missing) == f"config file {missing}: No such file or directory"
    broken = write(tmp_path, "listen = \n")
    assert config_error(broken).startswith(f"config file {broken}: invalid TOML")


# secrets ----------------------------------------------------------------------------------------
def secret_env() -> dict[str, str]:
    return {
        "DISPATCHER_DATABASE_URL": SECRET_URL,
        "DISPATCHER_API_TOKENS": ",".join(TOKENS),
        "DISPATCHER_HTTP__SIGNING_SECRET": SIGNING_SECRET,
    }


def assert_no_secret(text: str) -> None:
    for secret in ("hunter2-db-pass", *TOKENS, SIGNING_SECRET, SIGNING_SECRET[6:]):
        assert secret not in text


def test_public_view_masks_every_secret() -> None:
    env = {**secret_env(), "DISPATCHER_LISTEN": "0.0.0.0:8080"}
    view = load_settings(None, {**env, "DISPATCHER_ALLOW_PLAIN_HTTP_TOKENS": "1"}).public_view()
    text = json.dumps(view)
    assert_no_secret(text)
    assert view["database_url"] == "postgresql://app:*****@db.internal:5432/jobs"
    assert len(view["api_tokens"]) == 2
    assert view["http"]["signing_secret"] != SIGNING_SECRET
    assert view["listen"] == "0.0.0.0:8080"  # the rest is shown as effective


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        (
            "postgresql://u:pw@h/db?password=pw2&sslmode=require",
            "postgresql://u:*****@h/db?password=*****&sslmode=require",
        ),
        (
            "postgresql:///jobs?host=/run/postgresql&password=pw2",
            "postgresql:///jobs?host=/run/postgresql&password=*****",
        ),
        ("postgresql://u:p@w@h:5432/db", "postgresql://u:*****@h:5432/db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
    ],
)
def test_database_url_password_masked_wherever_it_is(url: str, masked: str) -> None:
    view = load_settings(None, {"DISPATCHER_DATABASE_URL": url}).public_view()
    assert view["database_url"] == masked


@pytest.mark.parametrize(
    "bad",
    [
        {"DISPATCHER_DRAIN_TIMEOUT_S": "-1"},
        {"DISPATCHER_LISTEN": "0.0.0.0:8080", "DISPATCHER_API_TOKENS": ""},
        {"DISPATCHER_HTTP__SIGNING_SECRET": "whsec_not*base64!"},
        {"DISPATCHER_API_TOKEN": "tok-typo-9f3a"},  # a misspelt secret name
        {"DISPATCHER_HTTP__SIGNING_SECRETS": "whsec_typo9f3a"},
    ],
    ids=lambda env: next(iter(env)),
)
def test_errors_never_show_a_secret(bad: dict[str, str]) -> None:
    env = {**secret_env(), **bad}
    message = config_error(**env)
    assert_no_secret(message)
    for value in bad.values():
        if "whsec" in value or "tok-" in value:
            assert value not in message


def test_a_secret_value_of_the_wrong_type_is_masked(tmp_path: Path) -> None:
    path = write(tmp_path, 'database_url = ["postgresql://u:hunter2-db-pass@h/db"]\n')
    message = config_error(path)
    assert message.startswith("setting database_url = '*****': ")
    assert_no_secret(message)


# the API must not be open to the network without tokens ---------------------------------------
@pytest.mark.parametrize(
    "listen", ["0.0.0.0:8080", "[::]:8080", "192.0.2.10:8080", "api.example:80"]
)
def test_non_loopback_listen_without_tokens_is_refused(listen: str) -> None:
    message = config_error(DISPATCHER_LISTEN=listen)
    assert "\n" not in message
    assert f"listen = {listen!r} is not loopback" in message
    assert "DISPATCHER_API_TOKENS" in message


@pytest.mark.parametrize("listen", ["127.0.0.1:8080", "127.8.9.10:1", "[::1]:8080", "localhost:80"])
def test_loopback_listen_needs_no_tokens(listen: str) -> None:
    assert load_settings(None, {"DISPATCHER_LISTEN": listen}).listen == listen


def test_non_loopback_listen_with_tokens_and_no_tls_is_refused() -> None:
    message = config_error(DISPATCHER_LISTEN="0.0.0.0:8080", DISPATCHER_API_TOKENS="t1")
    assert "\n" not in message
    assert "has no TLS" in message
    assert "DISPATCHER_TLS__CERT_FILE" in message
    assert "DISPATCHER_ALLOW_PLAIN_HTTP_TOKENS" in message
    assert_no_secret(message)


def test_non_loopback_listen_with_tokens_over_plain_http_when_allowed() -> None:
    env = {"DISPATCHER_LISTEN": "0.0.0.0:8080", "DISPATCHER_API_TOKENS": LONG}
    s = load_settings(None, {**env, "DISPATCHER_ALLOW_PLAIN_HTTP_TOKENS": "true"})
    assert s.all_api_tokens() == [LONG]


@pytest.mark.parametrize(
    "where",
    [
        {"DISPATCHER_LISTEN": "0.0.0.0:8080"},
        {"DISPATCHER_LISTEN": "[::]:8080"},
        {"DISPATCHER_CONSOLE_LISTEN": "192.0.2.10:9000"},  # the console signs in with them too
    ],
    ids=lambda env: next(iter(env.values())),
)
@pytest.mark.parametrize("short", ["x", "y" * 31])
def test_a_short_token_off_loopback_is_refused(where: dict[str, str], short: str) -> None:
    """Issue 20: a one-character token passed check-config on 0.0.0.0."""
    env = {
        **where,
        "DISPATCHER_ALLOW_PLAIN_HTTP_TOKENS": "true",
        "DISPATCHER_API_TOKENS": f"{TOKENS[0]};{short} read # viewer",
    }
    message = config_error(**env)
    assert "\n" not in message and (len(short) == 1 or short not in message)
    assert message.startswith("api_tokens[2]: API tokens must be at least 32 characters")
    assert "secrets.token_urlsafe(32)" in message  # how to make one
    env["DISPATCHER_API_TOKENS"] = f"{TOKENS[0]};{'y' * 32} read # viewer"
    assert len(load_settings(None, env).all_api_tokens()) == 2


def test_a_short_token_on_loopback_is_accepted() -> None:
    s = load_settings(None, {"DISPATCHER_LISTEN": "127.0.0.1:8080", "DISPATCHER_API_TOKENS": "t"})
    assert s.all_api_tokens() == ["t"]


def test_tokens_file_supplies_tokens(tmp_path: Path) -> None:
    tokens = write(tmp_path, f"\n{TOKENS[0]}\n  {TOKENS[1]}  \n\n", "tokens")
    s = load_settings(
        None,
        {
            "DISPATCHER_LISTEN": "0.0.0.0:8080",
            "DISPATCHER_ALLOW_PLAIN_HTTP_TOKENS": "true",
            "DISPATCHER_API_TOKENS_FILE": str(tokens),
            "DISPATCHER_API_TOKENS": LONG,
        },
    )
    assert s.all_api_tokens() == [LONG, *TOKENS]
    assert_no_secret(json.dumps(s.public_view()))
    assert s.public_view()["api_tokens_file"] == str(tokens)


def test_an_empty_tokens_file_does_not_open_the_network(tmp_path: Path) -> None:
    empty = write(tmp_path, "\n  \n", "tokens")
    message = config_error(DISPATCHER_LISTEN="0.0.0.0:8080", DISPATCHER_API_TOKENS_FILE=str(empty))
    assert "API tokens are required" in message


def test_an_unreadable_tokens_file_fails_at_load_even_on_loopback(tmp_path: Path) -> None:
    missing = tmp_path / "no-tokens"
    message = config_error(DISPATCHER_API_TOKENS_FILE=str(missing))
    assert message == f"api_tokens_file: cannot read {missing}: No such file or directory"


def test_signing_secret_file(tmp_path: Path) -> None:
    secret = write(tmp_path, SIGNING_SECRET + "\n", "signing")
    s = load_settings(None, {"DISPATCHER_HTTP__SIGNING_SECRET_FILE": str(secret)})
    assert s.signing_secret() == SIGNING_SECRET
    assert_no_secret(json.dumps(s.public_view()))

    missing = tmp_path / "nope"
    assert "cannot read" in config_error(DISPATCHER_HTTP__SIGNING_SECRET_FILE=str(missing))
    bad = write(tmp_path, "whsec_not*base64!\n", "bad-signing")
    message = config_error(DISPATCHER_HTTP__SIGNING_SECRET_FILE=str(bad))
    assert "http.signing_secret_file" in message
    assert "not*base64" not in message


# structural rules -------------------------------------------------------------------------------
def test_http_is_a_reserved_handler_name(tmp_path: Path) -> None:
    path = write(tmp_path, '[handlers.http]\nkind = "python"\nfunction = "m:f"\n')
    assert "'http' is the built-in" in config_error(path)


def test_queue_names_are_checked(tmp_path: Path) -> None:
    path = write(tmp_path, "[queues.default]\n[queues.'Bad Name']\n")
    message = config_error(path)
    assert message.startswith("setting queues: ")
    assert "'Bad Name'" in message


def test_handlers_from_the_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[handlers.report]\nkind = "python"\nfunction = "reports.monthly:run"\n'
        '[handlers.prune]\nkind = "sql"\nstatement = "DELETE FROM t WHERE id < $1"\n'
        'params = ["before"]\n',
    )
    s = load_settings(path, {})
    assert s.handlers["report"].function == "reports.monthly:run"
    assert s.handlers["prune"].params == ["before"]
    broken = write(
        tmp_path, '[handlers.prune]\nkind = "sql"\nstatement = "SELECT $1, $2"\n', "broken.toml"
    )
    assert "statement uses parameters [1, 2]" in config_error(broken)


def test_a_queue_configured_only_from_the_environment_keeps_the_default_queue() -> None:
    from dispatcher.config.settings import load_settings

    settings = load_settings(environ={"DISPATCHER_QUEUES__BULK__RATE_PER_S": "5"})
    assert settings.queues["bulk"].rate_per_s == 5
    assert "default" in settings.queues
