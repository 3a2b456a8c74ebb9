"""Infra syntax: every .bicep file under infra/ parses with the tree-sitter Bicep grammar (no ERROR/MISSING
node), and the azd layout is complete.
"""

from __future__ import annotations

import json

import pytest
from support.bicep_tree import INFRA, REPO, all_files, main, parse, syntax_errors

BICEP_FILES = sorted(INFRA.rglob("*.bicep"))


def test_the_checker_finds_syntax_errors() -> None:
    # A broken declaration must be reported, or the per-file test below could never fail.
    assert syntax_errors(parse(b"resource x 'A/b@2020-01-01' = {\n  name: \n"))
    assert syntax_errors(parse(b"param p string = 'unterminated\n"))
    assert not syntax_errors(parse(b"param p string = 'ok'\n"))


@pytest.mark.parametrize("path", BICEP_FILES, ids=lambda p: p.relative_to(INFRA).as_posix())
def test_bicep_file_parses(path) -> None:
    assert syntax_errors(parse(path.read_bytes())) == []


def test_azd_layout() -> None:
    assert (REPO / "azure.yaml").is_file()
    assert (INFRA / "main.parameters.json").is_file()
    assert json.loads((INFRA / "abbreviations.json").read_text())
    assert len(BICEP_FILES) >= 8, "one module per concern"
    scopes = [n for n in main().root.named_children if n.type == "target_scope_assignment"]
    assert len(scopes) == 1 and "'subscription'" in scopes[0].text.decode()


def test_resource_token_and_overridable_names() -> None:
    bicep = main()
    assert (
        "uniqueString(subscription().id, environmentName, location)" in bicep.variables["resourceToken"].text.decode()
    )
    name_params = [p for p in bicep.params if p.endswith("Name") and p != "environmentName"]
    for module in bicep.modules:
        for key, value in module.params().items():
            if key.endswith("Name") and "abbrs." in value.text.decode():
                # a generated name is always `!empty(<param>) ? <param> : <generated>`
                assert value.type == "ternary_expression", f"{module.symbol}.{key} is not overridable"
                assert value.named_children[0].text.decode().startswith("!empty(")
    assert {"resourceGroupName", "serviceBusNamespaceName", "cosmosAccountName", "functionAppName"} <= set(name_params)


def test_main_parameters_name_real_parameters() -> None:
    parameters = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    assert set(parameters) <= set(main().params), set(parameters) - set(main().params)
    assert parameters["environmentName"]["value"] == "${AZURE_ENV_NAME}"


def test_every_module_path_exists_and_registry_modules_are_pinned() -> None:
    for bicep in all_files():
        for module in bicep.modules:
            if module.source.startswith("br/"):
                assert module.source.rsplit(":", 1)[-1].count(".") == 2, f"unpinned {module.source}"
            else:
                assert (bicep.path.parent / module.source).is_file(), module.source


def test_every_resource_has_an_explicit_api_version() -> None:
    for bicep in all_files():
        for resource in bicep.resources:
            assert resource.api_version[:4].isdigit(), f"{bicep.name}: {resource.symbol} has no API version"


def test_azure_yaml_services() -> None:
    # No YAML parser in the dev requirements: the file is small and flat enough to check line by line.
    lines = (REPO / "azure.yaml").read_text().splitlines()
    assert "infra:" in lines and "  provider: bicep" in lines and "  path: infra" in lines
    services = {
        lines[i - 1].strip().rstrip(":"): line.strip()
        for i, line in enumerate(lines)
        if line.strip().startswith("project:")
    }
    hosts = [line.strip() for line in lines if line.strip().startswith("host:")]
    assert set(services) == {"api", "agent", "simulator"}
    assert hosts == ["host: function", "host: containerapp", "host: containerapp"]
    dockerfile = next(line.split(":", 1)[1].strip() for line in lines if line.strip().startswith("path: infra/"))
    assert (REPO / dockerfile).is_file()
    assert 'CMD ["python", "-m", "agent"]' in (REPO / dockerfile).read_text()
