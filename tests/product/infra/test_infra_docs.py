"""README.md "Deploy" section: azd up, the az deployment alternative, adding a submitting application, an
identity-based client (examples/client.py) that uses the real message schema, and teardown."""

from __future__ import annotations

import ast
import importlib.util
import json
import re

from support.bicep_tree import REPO, main

from orderflow.messages import SubmitOrder

DOC = (REPO / "README.md").read_text()
CLIENT = REPO / "examples" / "client.py"


def _deploy_section() -> str:
    match = re.search(r"^## Deploy\n(.*?)(?=^## |\Z)", DOC, re.MULTILINE | re.DOTALL)
    assert match, "README.md has no '## Deploy' section"
    return match.group(1)


def test_deploy_section_covers_every_step() -> None:
    section = _deploy_section()
    for needle in (
        "azd up",
        "az deployment sub create",
        "--template-file infra/main.bicep",
        "submittingApps",
        "### Adding a submitting application",
        "### Tearing down",
        "azd down",
    ):
        assert needle in section, needle


def test_cli_parameters_exist_in_main_bicep() -> None:
    command = re.search(r"az deployment sub create(.*?)```", _deploy_section(), re.DOTALL)
    assert command
    used = set(re.findall(r"(\w+)=", command.group(1)))
    assert used and used <= set(main().params), used - set(main().params)


def test_client_is_identity_based_python() -> None:
    """The Deploy section runs examples/client.py with the namespace only; the script's Azure path is
    DefaultAzureCredential, with no key."""
    section = _deploy_section()
    assert "examples/client.py" in section and "SERVICEBUS_FULLY_QUALIFIED_NAMESPACE" in section
    assert not re.search(r"SharedAccessKey|conn_str", section)
    script = CLIENT.read_text()
    tree = ast.parse(script)
    assert "ServiceBusClient(namespace, DefaultAzureCredential())" in script
    assert 'os.environ.get("SERVICEBUS_FULLY_QUALIFIED_NAMESPACE")' in script
    assert "session_id=order_id" in script
    assert not re.search(r"SharedAccessKey=\w", script)
    assert any(isinstance(n, ast.FunctionDef) and n.name == "sample_order" for n in ast.walk(tree))


def test_client_sample_orders_are_valid_submit_orders() -> None:
    spec = importlib.util.spec_from_file_location("example_client", CLIENT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    SubmitOrder.model_validate({**module.sample_order("order-1"), "submittedAt": "2025-01-01T00:00:00Z"})
    mine = json.loads((REPO / "examples" / "my-order.json").read_text())
    SubmitOrder.model_validate({**mine, "submittedAt": "2025-01-01T00:00:00Z"})


def test_outputs_table_names_real_outputs() -> None:
    section = _deploy_section()
    table = section[section.index("| output | use |") :].split("\n\n", 1)[0]
    named = set(re.findall(r"`([A-Z][A-Z_]+)`", table))
    assert len(named) >= 10
    assert named <= set(main().outputs), named - set(main().outputs)
