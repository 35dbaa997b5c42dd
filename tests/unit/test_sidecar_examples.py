"""The sidecar examples: valid against their schemas (Kubernetes' OpenAPI schemas through
kubernetes-validate, the compose-spec JSON schema shipped by check-jsonschema), the grace period
outlasts the daemon's stop budget, probes and secrets are wired, and the environment they give
the daemon is a configuration it accepts."""

from __future__ import annotations

import copy
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from dispatcher.config.settings import Settings, load_settings

yaml = pytest.importorskip("yaml", reason="PyYAML is absent: pip install pyyaml")

SIDECAR = Path(__file__).resolve().parents[2] / "config" / "sidecar"
STOP_MARGIN_S = 10
# what `openssl rand -hex 32` (the examples' own advice) makes: off loopback, 32+ characters
EXAMPLE_TOKEN = "5f0c" * 16


def drain_timeout_s(env: dict[str, str]) -> float:
    """The daemon's worst-case stop with this environment: soft stop, hard stop, hand-back."""
    settings = Settings(
        drain_timeout_s=env.get("DISPATCHER_DRAIN_TIMEOUT_S", Settings().drain_timeout_s),
        hard_stop_timeout_s=env.get(
            "DISPATCHER_HARD_STOP_TIMEOUT_S", Settings().hard_stop_timeout_s
        ),
    )
    return settings.stop_budget_s()


def duration_s(text: str) -> float:
    """A compose duration such as `45s` or `1m30s`."""
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    assert parts is not None and text, f"not a duration: {text!r}"
    hours, minutes, seconds = (int(p or 0) for p in parts.groups())
    return hours * 3600 + minutes * 60 + seconds


def accepted_by_the_daemon(env: dict[str, str], tmp_path: Path) -> None:
    """Load the settings from this environment, with the token file standing in locally."""
    tokens = tmp_path / "api-tokens"
    tokens.write_text(f"{EXAMPLE_TOKEN}\n")
    local = {k: v for k, v in env.items() if k.startswith("DISPATCHER_")}
    local["DISPATCHER_API_TOKENS_FILE"] = str(tokens)
    settings = load_settings(environ=local)
    assert settings.all_api_tokens() == [EXAMPLE_TOKEN]


# docker compose


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((SIDECAR / "docker-compose.yml").read_text())


def compose_problems(document: dict[str, Any]) -> list[str]:
    """What the compose-spec schema (as check-jsonschema ships it) finds wrong."""
    vendored = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(vendored.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(document)]


def test_compose_example_matches_the_compose_spec(compose: dict[str, Any]) -> None:
    assert compose_problems(compose) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("services", "dispatcher", "stop_grace_periode"), "65s"),  # misspelt
        (("services", "app", "depends_on", "dispatcher", "condition"), "service_ready"),
        (("services", "dispatcher", "environment"), 42),
    ],
)
def test_compose_schema_check_finds_mistakes(
    compose: dict[str, Any], path: tuple[str, ...], value: object
) -> None:
    broken = copy.deepcopy(compose)
    place = broken
    for key in path[:-1]:
        place = place[key]
    place[path[-1]] = value
    assert compose_problems(broken)


def test_compose_dispatcher_is_healthy_by_the_images_check(compose: dict[str, Any]) -> None:
    # The application starts once the image's HEALTHCHECK (/healthz) passes; nothing disables it.
    assert compose["services"]["app"]["depends_on"]["dispatcher"]["condition"] == "service_healthy"
    assert not compose["services"]["dispatcher"].get("healthcheck", {}).get("disable", False)


def test_compose_dispatcher_is_unprivileged(compose: dict[str, Any]) -> None:
    dispatcher = compose["services"]["dispatcher"]
    assert dispatcher["read_only"] is True
    assert dispatcher["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in dispatcher["security_opt"]


def test_compose_grace_period_outlasts_the_drain(compose: dict[str, Any]) -> None:
    dispatcher = compose["services"]["dispatcher"]
    grace_s = duration_s(dispatcher["stop_grace_period"])
    assert grace_s >= drain_timeout_s(dispatcher["environment"]) + STOP_MARGIN_S
    assert dispatcher["stop_signal"] == "SIGTERM"


def test_compose_database_outlives_the_drain(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert "postgres" in services["dispatcher"]["depends_on"]  # stopped after the dispatcher
    assert "dispatcher" in services["app"]["depends_on"]  # stopped before it
    assert "@postgres:" in services["dispatcher"]["environment"]["DISPATCHER_DATABASE_URL"]


def test_compose_tokens_come_from_a_secret(compose: dict[str, Any], tmp_path: Path) -> None:
    dispatcher = compose["services"]["dispatcher"]
    env = dispatcher["environment"]
    (secret,) = dispatcher["secrets"]
    assert secret in compose["secrets"]
    assert env["DISPATCHER_API_TOKENS_FILE"] == f"/run/secrets/{secret}"
    accepted_by_the_daemon(env, tmp_path)


# Kubernetes


# Native sidecars (an init container with restartPolicy: Always), which the example uses, are
# on by default from 1.29: check it there and on the newest version the validator knows.
KUBERNETES_VERSIONS = ("1.29", kubernetes_validate.latest_version())


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    documents = yaml.safe_load_all((SIDECAR / "kubernetes.yaml").read_text())
    return [d for d in documents if d]


@pytest.fixture(scope="module")
def deployment(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [d for d in manifests if d["kind"] == "Deployment"]
    return found


@pytest.fixture(scope="module")
def pod(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_kubernetes_example_matches_the_schema(
    manifests: list[dict[str, Any]], version: str
) -> None:
    for manifest in manifests:
        # strict: a field the schema does not know (a typo) is an error, not ignored
        kubernetes_validate.validate(manifest, version, strict=True)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "template", "spec", "terminationGracePeriodSecond"), 65),  # misspelt
        (("spec", "template", "spec", "terminationGracePeriodSeconds"), "65s"),
        (("spec", "replicas"), "two"),
    ],
)
def test_kubernetes_schema_check_finds_mistakes(
    deployment: dict[str, Any], path: tuple[str, ...], value: object
) -> None:
    broken = copy.deepcopy(deployment)
    place = broken
    for key in path[:-1]:
        place = place[key]
    place[path[-1]] = value
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.fixture(scope="module")
def sidecar(pod: dict[str, Any]) -> dict[str, Any]:
    containers = pod.get("initContainers", []) + pod["containers"]
    (found,) = [c for c in containers if c["name"] == "dispatcher"]
    return found


def container_env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_kubernetes_grace_period_outlasts_the_drain(
    pod: dict[str, Any], sidecar: dict[str, Any]
) -> None:
    grace_s = pod["terminationGracePeriodSeconds"]
    assert grace_s >= drain_timeout_s(container_env(sidecar)) + STOP_MARGIN_S


def test_kubernetes_probes(sidecar: dict[str, Any]) -> None:
    assert sidecar["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # The probed port is the listener that answers them without a token: the health listener
    # when there is one, else the API listener.
    env = container_env(sidecar)
    serving = env.get("DISPATCHER_METRICS_LISTEN") or env["DISPATCHER_LISTEN"]
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        port = sidecar[probe]["httpGet"]["port"]
        assert str(ports.get(port, port)) == serving.rpartition(":")[2], probe


def test_kubernetes_secrets_come_from_a_secret(
    pod: dict[str, Any], sidecar: dict[str, Any], tmp_path: Path
) -> None:
    env = container_env(sidecar)
    secret_volumes = {v["name"] for v in pod["volumes"] if "secret" in v}
    mounts = {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}
    directory = str(Path(env["DISPATCHER_API_TOKENS_FILE"]).parent)
    assert mounts.get(directory) in secret_volumes
    from_secret = {e["name"] for e in sidecar["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    assert "DISPATCHER_DATABASE_URL" in from_secret
    accepted_by_the_daemon(env, tmp_path)


def test_kubernetes_sidecar_is_unprivileged(pod: dict[str, Any], sidecar: dict[str, Any]) -> None:
    assert pod["securityContext"]["runAsNonRoot"] is True
    context = sidecar["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
