"""Upgrading a deployment from before per-app queues (issue 25 review): every app then held Azure Service Bus Data
Sender on orders-inbound, and Bicep is incremental, so those assignments survive the upgrade and any such app can
still send there as if it were the legacy app. The azd postprovision hook (infra/hooks/postprovision.sh, .ps1) lists
the Data Sender and Data Owner assignments on orders-inbound and on the namespace and reports (with
ORDERFLOW_PRUNE_SHARED_QUEUE_SENDERS=true deletes) every one main.bicep does not declare, keeping the legacy app's,
the function app's and the operators'. It reads main.bicep's outputs from the azd environment and never fails the
deployment. The sh hook runs here against a stand-in of `az` that answers the listings and records every call.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.bicep_tree import DEPLOYED, INFRA, REPO, Scope, evaluate, main, text, with_values

from orderflow.embedded.rights import FUNCTION_APP, OPERATORS
from orderflow.embedded.rights._grants import deployment_grants

HOOK = INFRA / "hooks" / "postprovision.sh"
PS_HOOK = HOOK.with_suffix(".ps1")
NAMESPACE = "/subscriptions/s-1/resourceGroups/rg-dev/providers/Microsoft.ServiceBus/namespaces/sb-dev"
QUEUE = f"{NAMESPACE}/queues/orders-inbound"
ROLE = "/subscriptions/s-1/providers/Microsoft.Authorization/roleDefinitions/"
SENDER = ROLE + "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39"
OWNER = ROLE + "090c5cfd-751d-490a-894a-3ce6f1109419"
RECEIVER = ROLE + "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0"
READER = ROLE + "acdd72a7-3385-48ef-bd42-f606fba81ae7"
SHOP, PARTNER, B2B = (
    "6f1c2d3e-0000-4000-8000-00000000000a",
    "6f1c2d3e-0000-4000-8000-00000000000b",
    "6f1c2d3e-0000-4000-8000-00000000000c",
)
APP_IDENTITY, OPERATORS_GROUP, STRANGER = (
    "6f1c2d3e-0000-4000-8000-0000000000f1",
    "6f1c2d3e-0000-4000-8000-0000000000f2",
    "6f1c2d3e-0000-4000-8000-0000000000f3",
)
# azd's environment after provisioning a deployment whose legacy app is `shop` (main.bicep's outputs).
OUTPUTS = {
    "ORDERS_QUEUE_RESOURCE_ID": QUEUE,
    "SERVICEBUS_NAMESPACE_RESOURCE_ID": NAMESPACE,
    "LEGACY_ORDERS_APP": "shop",
    "LEGACY_ORDERS_APP_PRINCIPAL_ID": SHOP,
    "AZURE_APP_IDENTITY_PRINCIPAL_ID": APP_IDENTITY,
    "OPERATOR_PRINCIPAL_ID": OPERATORS_GROUP,
}


def _assignment(scope: str, key: str, principal: str, role: str, kind: str = "ServicePrincipal", name: str = "") -> str:
    """One row of `az role assignment list --query "[].[id, principalId, roleDefinitionId, principalType,
    principalName]" -o tsv`."""
    return "\t".join([f"{scope}/providers/Microsoft.Authorization/roleAssignments/{key}", principal, role, kind, name])


def _id(scope: str, key: str) -> str:
    return f"{scope}/providers/Microsoft.Authorization/roleAssignments/{key}"


# What an upgraded deployment holds: on orders-inbound, the legacy app's Sender (the object id as Azure prints it, in
# upper case), the other apps' Senders from before per-app queues, the function app's Receiver and Reader; on the
# namespace, the operators' Sender and Receiver, and two grants nobody declared.
QUEUE_ROWS = [
    _assignment(QUEUE, "a-shop", SHOP.upper(), SENDER, name="shop-sender"),
    _assignment(QUEUE, "a-partner", PARTNER, SENDER, name="partner-sender"),
    _assignment(QUEUE, "a-b2b", B2B, OWNER, name="b2b-gateway"),
    _assignment(QUEUE, "a-func-receive", APP_IDENTITY, RECEIVER),
    _assignment(QUEUE, "a-func-read", APP_IDENTITY, READER),
]
NAMESPACE_ROWS = [
    _assignment(NAMESPACE, "n-ops-send", OPERATORS_GROUP, SENDER, kind="Group", name="orderflow operators"),
    _assignment(NAMESPACE, "n-ops-receive", OPERATORS_GROUP, RECEIVER, kind="Group", name="orderflow operators"),
    _assignment(NAMESPACE, "n-shop", SHOP, SENDER, name="shop-sender"),
    _assignment(NAMESPACE, "n-stranger", STRANGER, OWNER, kind="User"),
]
STALE = {_id(QUEUE, "a-partner"), _id(QUEUE, "a-b2b"), _id(NAMESPACE, "n-shop"), _id(NAMESPACE, "n-stranger")}
KEPT = {_id(QUEUE, "a-shop"), _id(NAMESPACE, "n-ops-send")}

AZ = r"""#!/bin/sh
printf '%s\n' "$*" >> "$STUB_LOG"
case "$*" in
  "role assignment list --scope $STUB_QUEUE "*)
    if [ -n "${STUB_LIST_FAILS:-}" ]; then
      echo "ERROR: (AuthorizationFailed) The client does not have authorization" >&2
      exit 1
    fi
    cat "$STUB_QUEUE_ROWS" ;;
  "role assignment list --scope $STUB_NAMESPACE "*) cat "$STUB_NAMESPACE_ROWS" ;;
  "role assignment delete --ids "*)
    case "$*" in
      *"${STUB_DELETE_FAILS:-no such id}") echo "ERROR: (AuthorizationFailed) no delete right" >&2; exit 1 ;;
    esac ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
exit 0
"""


def _run(
    tmp_path: Path,
    queue_rows: list[str] = QUEUE_ROWS,
    namespace_rows: list[str] = NAMESPACE_ROWS,
    with_az: bool = True,
    **env: str,
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if with_az:
        (bin_dir / "az").write_text(AZ)
        (bin_dir / "az").chmod(0o755)
    log = tmp_path / "calls.log"
    log.write_text("")
    (tmp_path / "queue.tsv").write_text("".join(f"{row}\n" for row in queue_rows))
    (tmp_path / "namespace.tsv").write_text("".join(f"{row}\n" for row in namespace_rows))
    environment = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "STUB_LOG": str(log),
        "STUB_QUEUE": QUEUE,
        "STUB_NAMESPACE": NAMESPACE,
        "STUB_QUEUE_ROWS": str(tmp_path / "queue.tsv"),
        "STUB_NAMESPACE_ROWS": str(tmp_path / "namespace.tsv"),
        **OUTPUTS,
        **env,
    }
    done = subprocess.run(["sh", str(HOOK)], env=environment, capture_output=True, text=True, timeout=30)
    return done, log.read_text().splitlines()


def _reported(stderr: str) -> set[str]:
    """The assignment ids the hook tells to delete."""
    return set(re.findall(r"az role assignment delete --ids (\S+)", stderr))


def _deleted(calls: list[str]) -> set[str]:
    return {c.removeprefix("role assignment delete --ids ") for c in calls if c.startswith("role assignment delete")}


def test_a_stale_sender_is_reported_with_its_delete_command_and_nothing_is_deleted(tmp_path: Path) -> None:
    done, calls = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert _reported(done.stderr) == STALE
    assert not _deleted(calls)
    # Each is named: the principal, its type and name, the role, the scope, what it allows.
    line = next(ln for ln in done.stderr.splitlines() if _id(QUEUE, "a-partner") in ln)
    assert f"ServicePrincipal {PARTNER} (partner-sender) holds Azure Service Bus Data Sender on {QUEUE}" in line
    assert "as if it were the legacy app (shop)" in line
    assert "Azure Service Bus Data Owner" in next(ln for ln in done.stderr.splitlines() if "n-stranger" in ln)
    assert "isolation on the shared queue orders-inbound does not hold" in done.stderr
    assert "azd env set ORDERFLOW_PRUNE_SHARED_QUEUE_SENDERS true" in done.stderr
    # The legacy app's own Sender on the queue, and the operators' on the namespace, are declared: not reported.
    for kept in KEPT:
        assert kept not in done.stderr
    assert calls == [
        f"role assignment list --scope {QUEUE} --query [].[id, principalId, roleDefinitionId, principalType, "
        "principalName] -o tsv",
        f"role assignment list --scope {NAMESPACE} --query [].[id, principalId, roleDefinitionId, principalType, "
        "principalName] -o tsv",
    ]


@pytest.mark.parametrize("switch", ["true", "True"])
def test_the_prune_switch_deletes_the_stale_senders_and_keeps_the_legacy_apps(tmp_path: Path, switch: str) -> None:
    done, calls = _run(tmp_path, ORDERFLOW_PRUNE_SHARED_QUEUE_SENDERS=switch)
    assert done.returncode == 0, done.stderr
    assert _deleted(calls) == STALE
    assert not _deleted(calls) & KEPT
    assert "deleted 4 stale sender assignment(s)" in done.stderr
    assert "does not hold" not in done.stderr


@pytest.mark.parametrize("switch", ["", "false", "yes", "1"])
def test_anything_but_true_only_reports(tmp_path: Path, switch: str) -> None:
    done, calls = _run(tmp_path, ORDERFLOW_PRUNE_SHARED_QUEUE_SENDERS=switch)
    assert done.returncode == 0 and _reported(done.stderr) == STALE and not _deleted(calls)


def test_once_the_legacy_queue_is_closed_the_legacy_apps_grant_is_stale_too(tmp_path: Path) -> None:
    # legacyOrdersQueueOpen=false: main.bicep outputs no legacy sender, so the legacy app's grant is reported too.
    apps = {"shop": SHOP, "partner": PARTNER, "b2b": B2B}
    open_queue = evaluate(main().outputs["LEGACY_ORDERS_APP_PRINCIPAL_ID"], _deployment("shop", True, apps))
    closed = evaluate(main().outputs["LEGACY_ORDERS_APP_PRINCIPAL_ID"], _deployment("shop", False, apps))
    assert (open_queue, closed) == (SHOP, "")
    done, _ = _run(tmp_path, LEGACY_ORDERS_APP_PRINCIPAL_ID=closed)
    assert done.returncode == 0
    assert _reported(done.stderr) == STALE | {_id(QUEUE, "a-shop")}


def test_a_clean_deployment_is_said_to_be_clean(tmp_path: Path) -> None:
    # Only the declared senders; a grant that does not send (a Receiver, a Reader) is none of its business.
    others = [_assignment(QUEUE, "a-other-receive", STRANGER, RECEIVER), _assignment(NAMESPACE, "n-read", B2B, READER)]
    done, calls = _run(
        tmp_path,
        queue_rows=QUEUE_ROWS[:1] + QUEUE_ROWS[3:] + others[:1],
        namespace_rows=NAMESPACE_ROWS[:2] + others[1:],
    )
    assert done.returncode == 0 and not _reported(done.stderr) and not _deleted(calls)
    assert "no sender but the declared ones" in done.stderr and "WARNING" not in done.stderr


def test_a_listing_error_is_a_warning_and_the_namespace_is_still_checked(tmp_path: Path) -> None:
    done, calls = _run(tmp_path, STUB_LIST_FAILS="1", ORDERFLOW_PRUNE_SHARED_QUEUE_SENDERS="true")
    assert done.returncode == 0, done.stderr
    assert f"could not list the role assignments on {QUEUE}: ERROR: (AuthorizationFailed)" in done.stderr
    assert f"check by hand: az role assignment list --scope {QUEUE}" in done.stderr
    assert _deleted(calls) == {_id(NAMESPACE, "n-shop"), _id(NAMESPACE, "n-stranger")}


def test_a_failed_delete_is_a_warning_and_still_counts(tmp_path: Path) -> None:
    done, calls = _run(tmp_path, ORDERFLOW_PRUNE_SHARED_QUEUE_SENDERS="true", STUB_DELETE_FAILS="a-b2b")
    assert done.returncode == 0, done.stderr
    assert _deleted(calls) == STALE
    assert f"could not delete {_id(QUEUE, 'a-b2b')}" in done.stderr
    assert "until these 1 assignment(s) are removed, isolation on the shared queue" in done.stderr


@pytest.mark.parametrize(
    "env",
    [{"ORDERS_QUEUE_RESOURCE_ID": ""}, {"SERVICEBUS_NAMESPACE_RESOURCE_ID": ""}, {"with_az": False}],
    ids=["no-queue-output", "no-namespace-output", "no-az"],
)
def test_without_its_inputs_the_hook_warns_and_lets_the_deployment_go_on(tmp_path: Path, env: dict[str, Any]) -> None:
    done, calls = _run(tmp_path, **env)
    assert done.returncode == 0 and "WARNING" in done.stderr and "not checked" in done.stderr
    assert calls == []


# ---------------------------------------------------------------- the hook and main.bicep agree


def _deployment(legacy: str | None, queue_open: bool = True, principals: dict[str, str] | None = None) -> Scope:
    """main.bicep with the apps shop, partner and b2b (each principal id its name unless `principals` gives one) and
    an operators group."""
    ids = principals or {}
    values: dict[str, Any] = {
        "submittingApps": [
            {"name": n, "principalId": ids.get(n, n), "principalType": "ServicePrincipal"}
            for n in ("shop", "partner", "b2b")
        ],
        "operatorPrincipalId": OPERATORS,
        "legacyOrdersQueueOpen": queue_open,
    }
    if legacy is not None:
        values["legacyOrdersApp"] = legacy
    return with_values(Scope(main(), functions=DEPLOYED), values)


CASES = {
    "legacy-default": (None, True, "shop"),
    "legacy-second": ("partner", True, "partner"),
    "no-legacy": ("none", True, ""),
    "legacy-queue-closed": ("partner", False, ""),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_hook_keeps_exactly_the_senders_main_bicep_declares(tmp_path: Path, case: str) -> None:
    """Deploy three apps and the operators (each principal id a placeholder: its name); give every identity a Data
    Sender on orders-inbound and on the namespace; the hook must report exactly those main.bicep does not grant send
    there (the function app, which holds none, it leaves alone too), with the outputs main.bicep gives it."""
    legacy, queue_open, sender = CASES[case]
    deployment = _deployment(legacy, queue_open)
    outputs = main().outputs
    assert evaluate(outputs["LEGACY_ORDERS_APP_PRINCIPAL_ID"], deployment) == sender
    assert evaluate(outputs["OPERATOR_PRINCIPAL_ID"], deployment) == OPERATORS
    # Who main.bicep lets send to orders-inbound (a grant on the queue or the namespace), and on the whole namespace.
    senders = [
        g
        for g in deployment_grants(deployment)
        if g.service == "servicebus" and g.role.name in ("Service Bus Data Sender", "Service Bus Data Owner")
    ]
    declared = {
        "orders-inbound": {g.identity for g in senders if g.covers("orders-inbound")},
        "": {g.identity for g in senders if g.resource == ""},
    }
    identities = ["shop", "partner", "b2b", OPERATORS, FUNCTION_APP, "agent"]
    done, _ = _run(
        tmp_path,
        queue_rows=[_assignment(QUEUE, f"q-{i}", i, SENDER) for i in identities],
        namespace_rows=[_assignment(NAMESPACE, f"n-{i}", i, SENDER) for i in identities],
        LEGACY_ORDERS_APP_PRINCIPAL_ID=sender,
        AZURE_APP_IDENTITY_PRINCIPAL_ID=FUNCTION_APP,
        OPERATOR_PRINCIPAL_ID=OPERATORS,
    )
    assert done.returncode == 0, done.stderr
    expected = {_id(QUEUE, f"q-{i}") for i in set(identities) - declared["orders-inbound"] - {FUNCTION_APP}}
    expected |= {_id(NAMESPACE, f"n-{i}") for i in set(identities) - declared[""] - {FUNCTION_APP}}
    assert _reported(done.stderr) == expected
    assert declared["orders-inbound"] == {OPERATORS} | ({sender} if sender else set())  # the rights, as documented


def test_the_hooks_read_main_bicep_outputs() -> None:
    """Every azd environment value the hooks read is one main.bicep outputs, except the prune switch."""
    outputs = main().outputs
    assert text(outputs["ORDERS_QUEUE_RESOURCE_ID"]) == "'${serviceBus.outputs.namespaceId}/queues/${ordersQueueName}'"
    assert text(outputs["AZURE_APP_IDENTITY_PRINCIPAL_ID"]) == "identity.outputs.appPrincipalId"
    assert text(outputs["SERVICEBUS_NAMESPACE_RESOURCE_ID"]) == "serviceBus.outputs.namespaceId"
    read_sh = set(re.findall(r"\$\{([A-Z][A-Z_]+):-", HOOK.read_text()))
    read_ps = set(re.findall(r"\$env:([A-Z][A-Z_]+)", PS_HOOK.read_text()))
    assert read_sh == read_ps
    assert read_sh - set(outputs) == {"ORDERFLOW_PRUNE_SHARED_QUEUE_SENDERS"}
    assert set(OUTPUTS) <= read_sh


def test_both_hooks_check_the_same_roles_and_never_fail_the_deployment() -> None:
    for hook in (HOOK, PS_HOOK):
        source = hook.read_text()
        assert "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39" in source and "090c5cfd-751d-490a-894a-3ce6f1109419" in source
        assert "az role assignment delete --ids" in source and "ORDERFLOW_PRUNE_SHARED_QUEUE_SENDERS" in source
        assert not re.search(r"\bexit [1-9]", source), hook.name
        assert "set -e" not in source
    assert "trap {" in PS_HOOK.read_text() and "$ErrorActionPreference = 'Continue'" in PS_HOOK.read_text()


def test_azd_runs_the_hook_after_every_provision() -> None:
    lines = (REPO / "azure.yaml").read_text().splitlines()
    hooks = lines[lines.index("hooks:") : lines.index("services:")]
    at = hooks.index("  postprovision:")
    assert hooks[at + 1 : at + 7] == [
        "    posix:",
        "      shell: sh",
        "      run: infra/hooks/postprovision.sh",
        "    windows:",
        "      shell: pwsh",
        "      run: infra/hooks/postprovision.ps1",
    ]
    assert os.access(HOOK, os.X_OK) and PS_HOOK.is_file()


def test_the_migration_section_says_isolation_does_not_hold_until_the_grants_go() -> None:
    deploy = (REPO / "docs" / "deploy.md").read_text()
    heading = "#### Upgrading: stale senders on orders-inbound"
    section = deploy[deploy.index(heading) : deploy.index("#### Move an app to its own queue")]
    flat = " ".join(section.split())
    assert "**Until those grants are removed, isolation on the shared queue does not hold**" in flat
    for needle in (
        "infra/hooks/postprovision.sh",
        "azd env set ORDERFLOW_PRUNE_SHARED_QUEUE_SENDERS true",
        "Data Owner",
    ):
        assert needle in flat, needle
    for output in OUTPUTS:
        if output != "LEGACY_ORDERS_APP":
            assert f"`{output}`" in flat, output
    # The hooks point at this section by its name.
    for hook in (HOOK, PS_HOOK):
        assert '"Upgrading: stale senders on orders-inbound"' in " ".join(hook.read_text().split())
