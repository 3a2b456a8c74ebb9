"""README.md "Deploy" section: azd up, the az deployment alternative, adding a submitting application, an
identity-based send/receive snippet that is valid Python and uses the real message schema, and teardown."""

from __future__ import annotations

import ast
import re

from orderflow.messages import SubmitOrder

from .bicep_tree import REPO, main

DOC = (REPO / "README.md").read_text()


def _deploy_section() -> str:
    match = re.search(r"^## Deploy\n(.*?)(?=^## |\Z)", DOC, re.MULTILINE | re.DOTALL)
    assert match, "README.md has no '## Deploy' section"
    return match.group(1)


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", _deploy_section(), re.DOTALL)


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


def test_snippet_is_identity_based_python() -> None:
    (snippet,) = _python_blocks()
    ast.parse(snippet)
    assert "DefaultAzureCredential()" in snippet and "ServiceBusClient(namespace" in snippet
    assert "session_id=order_id" in snippet
    assert not re.search(r"from_connection_string|SharedAccessKey|conn_str", snippet)


def test_snippet_order_is_a_valid_submit_order() -> None:
    (snippet,) = _python_blocks()
    tree = ast.parse(snippet)
    order = next(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "order"
    )
    literal = {k.value: v for k, v in zip(order.keys, order.values, strict=True)}  # type: ignore[union-attr]
    fields = {
        key: ast.literal_eval(value)
        for key, value in literal.items()
        if key not in ("orderId", "replyTo", "submittedAt")
    }  # computed in the snippet
    SubmitOrder.model_validate(
        {**fields, "orderId": "order-1", "replyTo": "app-status", "submittedAt": "2025-01-01T00:00:00Z"}
    )


def test_outputs_table_names_real_outputs() -> None:
    section = _deploy_section()
    table = section[section.index("| output | use |") :].split("\n\n", 1)[0]
    named = set(re.findall(r"`([A-Z][A-Z_]+)`", table))
    assert len(named) >= 10
    assert named <= set(main().outputs), named - set(main().outputs)
