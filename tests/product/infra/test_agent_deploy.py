"""A first `azd up` gives a working system, and a re-provision keeps it: the Agent's container app (and the
remote-service simulator's) runs an image that can run what it is asked to, the simulator is deployed exactly when
AGENT_REMOTE_URL is empty and the Agent then calls it, and azure.yaml deploys what main.bicep provisions.

Read from the tree with main.parameters.json expanded as azd expands it (bicep_tree.azd_parameters) for a new
environment and for a re-provision, where azd reports each containerapp service's app as existing.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from support.bicep_tree import (
    DEPLOYED,
    INFRA,
    REPO,
    Opaque,
    Scope,
    app,
    azd_parameters,
    azure_yaml_services,
    evaluate,
    main,
    module_scope,
    param_type,
    text,
    with_values,
)

from lab.simulator import build_parser

PLACEHOLDER = "mcr.microsoft.com/azuredocs/containerapps-helloworld:latest"
NEW = {"AZURE_PRINCIPAL_TYPE": "User"}
# azd sets SERVICE_<NAME>_RESOURCE_EXISTS in a preprovision handler of each containerapp service (azure-dev
# cli/azd/pkg/project/service_target_containerapp.go, addPreProvisionChecks; the name from environment.Key()).
REPROVISION = {**NEW, "SERVICE_AGENT_RESOURCE_EXISTS": "true", "SERVICE_SIMULATOR_RESOURCE_EXISTS": "true"}


def _main_scope(env: dict[str, str], functions: frozenset[str] = frozenset({"empty"})) -> Scope:
    """main.bicep as azd deploys it with `env`; a bool parameter's "true"/"false" is a bool, as ARM reads it."""
    values: dict[str, Any] = {}
    for name, value in azd_parameters(env).items():
        values[name] = value == "true" if param_type(main(), name) == "bool" and isinstance(value, str) else value
    return with_values(Scope(main(), functions=functions), values)


def _container(file: str, symbol: str, scope: Scope) -> dict[str, Any]:
    (node,) = app(file).resource(symbol).get("properties", "template", "containers").named_children
    return evaluate(node, scope)


def _deployed_image(file: str, scope: Scope) -> Any:
    """The image of the container app in `file`: container-image.bicep's output as the file invokes it."""
    inner = module_scope(scope, app(file).module("image"))
    return evaluate(inner.file.outputs["image"], inner), inner


def _cmd(dockerfile: str) -> list[str]:
    (line,) = re.findall(r"^CMD (\[.*\])$", (INFRA / "agent" / dockerfile).read_text(), re.M)
    return json.loads(line)


def _agent(env: dict[str, str]) -> Scope:
    return module_scope(_main_scope(env), main().module("agent"))


def _simulator(env: dict[str, str]) -> Scope:
    return module_scope(_main_scope(env), main().module("simulator"))


def test_the_agent_image_runs_the_agent_and_no_command_overrides_it() -> None:
    # azd deploy changes containers[0].image only (azure-dev cli/azd/pkg/containerapps/container_app.go,
    # AddRevision): what runs after it is the image's CMD, so the Bicep must set none.
    assert _cmd("Dockerfile") == ["python", "-m", "agent"]
    assert azure_yaml_services()["agent"]["docker/path"] == "infra/agent/Dockerfile"
    for env in (NEW, REPROVISION):
        container = _container("agent.bicep", "agent", _agent(env))
        assert "command" not in container and "args" not in container


def test_a_new_environment_starts_the_placeholder_on_its_own_entrypoint() -> None:
    image, _ = _deployed_image("agent.bicep", _agent(NEW))
    assert image == PLACEHOLDER
    assert (
        evaluate(app("agent.bicep").resource("agent").get("properties", "template", "containers"), _agent(NEW))[0][
            "image"
        ]
        == PLACEHOLDER
    )


@pytest.mark.parametrize("file", ["agent.bicep", "simulator.bicep"])
def test_a_reprovision_keeps_the_image_azd_deployed(file: str) -> None:
    scope = _agent(REPROVISION) if file == "agent.bicep" else _simulator(REPROVISION)
    image, inner = _deployed_image(file, scope)
    # The image the existing app runs now: a property of the `existing` lookup of that very app.
    assert isinstance(image, Opaque) and image.text.endswith(".properties.template.containers[0].image"), image
    lookup = inner.file.resource(image.text.split("!")[0].split(".")[0])
    assert lookup.existing and lookup.type == "Microsoft.App/containerApps"
    assert evaluate(lookup.condition, inner) is True
    (deployed,) = [r for r in app(file).resources_of("Microsoft.App/containerApps") if not r.existing]
    assert text(lookup.get("name")) == "containerAppName" and text(deployed.get("name")) == "containerAppName"
    # ...and a new app of either kind gets the placeholder, never a stale guess.
    new_scope = _agent(NEW) if file == "agent.bicep" else _simulator(NEW)
    assert _deployed_image(file, new_scope)[0] == PLACEHOLDER


def test_each_containerapp_service_reports_its_app_through_the_exists_pattern() -> None:
    parameters = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    modules = {"agent": "agent", "simulator": "simulator"}
    for service, settings in azure_yaml_services().items():
        if settings["host"] != "containerapp":
            continue
        param = f"{service}Exists"
        assert parameters[param]["value"] == f"${{SERVICE_{service.upper().replace('-', '_')}_RESOURCE_EXISTS=false}}"
        assert param_type(main(), param) == "bool"
        assert text(main().module(modules[service]).params()["exists"]) == param
        # azd finds the app by its azd-service-name tag.
        (deployed,) = [r for r in app(f"{service}.bicep").resources_of("Microsoft.App/containerApps") if not r.existing]
        assert f"'azd-service-name': '{service}'" in text(deployed.get("tags"))


@pytest.mark.parametrize(
    ("remote", "simulated"), [("", True), ("https://remote.example.com", False)], ids=["no-remote-url", "remote-url"]
)
def test_the_simulator_is_deployed_exactly_when_agent_remote_url_is_empty(remote: str, simulated: bool) -> None:
    env = {**NEW, "AGENT_REMOTE_URL": remote}
    scope = _main_scope(env)
    assert evaluate(main().module("simulator").condition, scope) is simulated
    assert evaluate(main().outputs["ORDERFLOW_SIMULATOR_DEPLOYED"], scope) is simulated
    url = {e["name"]: e["value"] for e in _container("agent.bicep", "agent", _agent(env))["env"]}["AGENT_REMOTE_URL"]
    if not simulated:
        assert url == remote
        return
    # The simulator's internal ingress address (agent.bicep), with the name the simulator module deploys.
    assert isinstance(url, Opaque) and url.text == (
        "'https://${simulatorContainerAppName}.internal.${environment.properties.defaultDomain}'"
    )
    agent_params, simulator_params = main().module("agent").params(), main().module("simulator").params()
    assert text(agent_params["simulatorContainerAppName"]) == "useSimulator ? simulatorAppName : ''"
    assert text(simulator_params["containerAppName"]) == "simulatorAppName"


def test_no_default_points_the_agent_at_a_service_that_does_not_exist() -> None:
    for path in (INFRA / "main.parameters.json", INFRA / "main.bicep", INFRA / "app" / "agent.bicep"):
        assert ".invalid" not in path.read_text(), path.name
    assert azd_parameters(NEW)["agentRemoteUrl"] == ""


def test_the_simulator_listens_where_its_internal_ingress_sends() -> None:
    command = _cmd("Dockerfile.simulator")
    assert command[:3] == ["python", "-m", "lab.simulator"]
    args = build_parser().parse_args(command[3:])
    ingress = evaluate(
        app("simulator.bicep").resource("simulator").get("properties", "configuration", "ingress"), _simulator(NEW)
    )
    assert ingress["external"] is False and ingress["allowInsecure"] is False
    assert args.host == "0.0.0.0" and args.port == ingress["targetPort"]
    # The placeholder of a new app (containerapps-helloworld) serves on port 80: the same ingress fits both images.
    assert ingress["targetPort"] == 80
    assert args.db.startswith("/tmp/")
    container = _container("simulator.bicep", "simulator", _simulator(REPROVISION))
    assert "command" not in container and "args" not in container
    # One replica: its effects ledger is one SQLite file, which replicas would not share.
    scale = evaluate(
        app("simulator.bicep").resource("simulator").get("properties", "template", "scale"), _simulator(NEW)
    )
    assert scale == {"minReplicas": 1, "maxReplicas": 1}


def test_azure_yaml_deploys_the_simulator_exactly_when_it_is_provisioned() -> None:
    services = azure_yaml_services()
    simulator = services["simulator"]
    assert simulator["docker/path"] == "infra/agent/Dockerfile.simulator" and simulator["host"] == "containerapp"
    # azd evaluates a service's `condition` with its environment, where provisioning wrote main.bicep's outputs
    # (azure-dev cli/azd/pkg/project/service_config.go IsEnabled, importer.go ServiceStableFiltered).
    (output,) = re.fullmatch(r"\$\{([A-Z_]+)\}", simulator["condition"]).groups()
    assert text(main().outputs[output]) == "useSimulator"
    assert text(main().module("simulator").condition).strip("() ") == "useSimulator"
    assert "condition" not in services["agent"] and "condition" not in services["api"]


def test_azure_yaml_requires_the_azd_that_has_service_conditions() -> None:
    # `condition` on a service: azure-dev #6684, first released in azd 1.23.4 (tag azure-dev-cli_1.23.4); it also
    # fills AZURE_PRINCIPAL_TYPE (since 1.17.1, azure-dev CHANGELOG #5285).
    azure_yaml = (REPO / "azure.yaml").read_text()
    assert re.search(r'^requiredVersions:\n  azd: ">= 1\.23\.4"$', azure_yaml, re.M)
    readme = (REPO / "README.md").read_text()
    deploy = readme[readme.index("## Deploy") :]
    assert "`azd`) 1.23.4 or later" in deploy
    assert "1.23.4" in (REPO / "docs" / "deploy.md").read_text()


# ---------------------------------------------------------------- the Agent's liveness probe (issue 25)


def test_the_agent_container_has_an_http_liveness_probe_on_its_health_port() -> None:
    """Container Apps probes are httpGet or tcpSocket only; a TCP accept succeeds while the Agent's event loop is
    blocked, so the probe is an HTTP GET of /healthz on AGENT_HEALTH_PORT, the port agent.bicep also gives the Agent."""
    agent = app("agent.bicep")
    scope = _agent(REPROVISION)
    probe = evaluate(agent.variables["livenessProbe"], scope)
    assert probe["type"] == "Liveness" and set(probe) - {"type"} >= {"httpGet", "periodSeconds", "failureThreshold"}
    assert probe["httpGet"] == {"path": "/healthz", "port": 8080, "scheme": "HTTP"}
    assert "tcpSocket" not in probe
    # Within Container Apps' bounds (initial delay 0-60 s, period 1-240 s, failures 1-10), and a hung Agent is
    # restarted within a minute: first check after 10 s, then 3 failures 10 s apart.
    assert 0 <= probe["initialDelaySeconds"] <= 60 and 1 <= probe["periodSeconds"] <= 240
    assert 1 <= probe["failureThreshold"] <= 10 and probe["timeoutSeconds"] < probe["periodSeconds"]
    assert probe["initialDelaySeconds"] + probe["periodSeconds"] * probe["failureThreshold"] <= 60
    env = {e["name"]: e["value"] for e in _container("agent.bicep", "agent", scope)["env"]}
    assert isinstance(env["AGENT_HEALTH_PORT"], Opaque) and env["AGENT_HEALTH_PORT"].text == "string(healthPort)"
    assert evaluate(agent.variables["healthPort"], scope) == probe["httpGet"]["port"]


def test_the_probe_runs_only_on_an_image_azd_deployed() -> None:
    """The placeholder of a new app has no health endpoint (a probe would restart it again and again): a new app gets
    no probe; once azd has deployed the Agent image, a provision sets it."""
    new = module_scope(_main_scope(NEW, DEPLOYED), main().module("agent"))
    assert evaluate(app("agent.bicep").variables["runsDeployedImage"], new) is False
    assert _container("agent.bicep", "agent", new)["probes"] == []
    agent = app("agent.bicep")
    assert text(agent.variables["runsDeployedImage"]) == "image.outputs.image != placeholderImage"
    (container,) = agent.resource("agent").get("properties", "template", "containers").named_children
    probes = evaluate(container, _agent(REPROVISION))["probes"]
    assert isinstance(probes, Opaque)
    assert " ".join(probes.text.split()) == "runsDeployedImage ? [ livenessProbe ] : []"
