"""Operators sign in (issue 25): the function app has App Service authentication ("Easy Auth", authsettingsV2) with
Microsoft Entra ID, read from the Bicep tree as main.bicep deploys it: every request needs a bearer token for the
operator API's app registration (requireAuthentication, Return401, no excluded path, no client secret), an empty
authClientId fails the deployment, and the operator app role is required twice: by Entra ID (the azd preprovision hook
declares the role and sets appRoleAssignmentRequired on the service principal) and by the code (app setting
OperatorAppRole, the role the routes check in the caller's roles claim). The hook itself runs here against stand-ins
of `az` and `azd` that record every call.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
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
    with_values,
)

from orderflow import ops_http

CLIENT_ID = "7c0a4e3e-1111-4222-8333-444455556666"
TENANT_ID = "0f0e0d0c-aaaa-4bbb-8ccc-ddddeeeeffff"
HOOK = INFRA / "hooks" / "preprovision.sh"
AZURE_CLI_CLIENT_ID = "04b07795-8ddb-461a-bbee-02f9e1bf7b46"


def _main_scope(**values: Any) -> Scope:
    return with_values(Scope(main(), functions=DEPLOYED), values)


def _function_scope(**values: Any) -> Scope:
    return module_scope(_main_scope(**values), main().module("functionApp"))


def text_of_param(name: str) -> str:
    """What main.bicep passes the function module as `name`."""
    return main().module("functionApp").params()[name].text.decode()


def _auth(scope: Scope) -> dict[str, Any]:
    (resource,) = [
        r for r in app("function.bicep").resources_of("Microsoft.Web/sites/config") if r.symbol != "appSettings"
    ]
    assert resource.get("name") is not None and evaluate(resource.get("name"), scope) == "authsettingsV2"
    assert resource.get("parent") is not None and resource.get("parent").text.decode() == "functionApp"
    return evaluate(resource.get("properties"), scope)


def test_easy_auth_requires_a_token_of_the_operator_apis_registration() -> None:
    auth = _auth(_function_scope(authClientId=CLIENT_ID, authTenantId=TENANT_ID))
    assert auth["platform"] == {"enabled": True}
    # Every HTTP route: no sign-in, no request (401, never a login redirect); nothing excluded.
    assert auth["globalValidation"] == {"requireAuthentication": True, "unauthenticatedClientAction": "Return401"}
    assert auth["httpSettings"] == {"requireHttps": True}
    aad = auth["identityProviders"]["azureActiveDirectory"]
    assert set(auth["identityProviders"]) == {"azureActiveDirectory"} and aad["enabled"] is True
    assert aad["registration"]["clientId"] == CLIENT_ID
    assert aad["validation"]["allowedAudiences"] == [CLIENT_ID, f"api://{CLIENT_ID}"]
    # The tenant's v2.0 issuer (environment()'s login endpoint: other clouds work too).
    issuer = aad["registration"]["openIdIssuer"]
    assert isinstance(issuer, Opaque) and issuer.text == (
        "'${environment().authentication.loginEndpoint}${authTenantId}/v2.0'"
    )
    assert text_of_param("authTenantId") == "authTenantId"
    assert main().params["authTenantId"].text.decode() == "subscription().tenantId"
    # Token validation only: no client secret (nor a certificate), no token store, no browser session.
    assert set(aad["registration"]) == {"clientId", "openIdIssuer"}
    assert auth["login"] == {"tokenStore": {"enabled": False}}


def test_an_empty_client_id_fails_the_deployment() -> None:
    # main.bicep passes operatorAuthClientId: the id, or Bicep's fail() with a message that says what to do.
    assert text_of_param("authClientId") == "operatorAuthClientId"
    assert evaluate(main().params["authClientId"], Scope(main())) == ""
    empty = evaluate(main().variables["operatorAuthClientId"], _main_scope(authClientId=""))
    assert isinstance(empty, Opaque) and empty.text.startswith("fail('authClientId is empty")
    assert "AUTH_CLIENT_ID" in empty.text and "authClientId=" in empty.text
    assert evaluate(main().variables["operatorAuthClientId"], _main_scope(authClientId=CLIENT_ID)) == CLIENT_ID
    # azd passes what the hook set; without it the value is empty, and the deployment stops.
    assert azd_parameters({"AUTH_CLIENT_ID": CLIENT_ID})["authClientId"] == CLIENT_ID
    assert azd_parameters({})["authClientId"] == ""


def test_the_operator_role_is_the_one_the_code_checks_and_the_hook_declares() -> None:
    default = evaluate(main().params["operatorAppRole"], Scope(main()))
    assert default == "Orders.Operator" == ops_http.DEFAULT_ROLE
    settings = evaluate(
        app("function.bicep").variables["codeSettings"], _function_scope(authClientId=CLIENT_ID, operatorAppRole="X.Y")
    )
    assert settings[ops_http.ROLE_SETTING] == "X.Y"  # the app setting the routes read (orderflow/ops_http.py)
    assert azd_parameters({})["operatorAppRole"] == default
    assert azd_parameters({"ORDERFLOW_OPERATOR_APP_ROLE": "Ops.Admin"})["operatorAppRole"] == "Ops.Admin"
    for hook in (HOOK, HOOK.with_suffix(".ps1")):
        source = hook.read_text()
        assert "ORDERFLOW_OPERATOR_APP_ROLE" in source and (f"'{default}'" in source or f":-{default}}}" in source)
        assert "appRoleAssignmentRequired=true" in source
        # Identity only: the registration gets no password or certificate credential.
        assert not re.search(r"credential reset|addPassword|--password|--cert", source, re.IGNORECASE), hook.name


def test_azd_runs_the_hook_before_every_provision() -> None:
    lines = (REPO / "azure.yaml").read_text().splitlines()
    hooks = lines[lines.index("hooks:") : lines.index("services:")]
    assert "  preprovision:" in hooks
    assert "      run: infra/hooks/preprovision.sh" in hooks and "      run: infra/hooks/preprovision.ps1" in hooks
    assert "      shell: sh" in hooks and "      shell: pwsh" in hooks
    assert HOOK.is_file() and os.access(HOOK, os.X_OK) and HOOK.with_suffix(".ps1").is_file()
    assert "hooks" not in azure_yaml_services()


# ---------------------------------------------------------------- the hook, against stand-ins of az and azd

# Answers of the az stand-in by the start of its arguments (the first that matches); every call is logged.
AZ = r"""#!/bin/sh
printf '%s\n' "$*" >> "$STUB_LOG"
case "$*" in
  "account show --query id -o tsv") echo sub-1 ;;
  "account show --query tenantId -o tsv") echo "$STUB_TENANT" ;;
  "account show --subscription "*) echo "${STUB_SUBSCRIPTION_TENANT:-$STUB_TENANT}" ;;
  "cloud show "*) echo https://graph.microsoft.com/ ;;
  "ad app create "*) echo new-client ;;
  "ad app show "*) echo "$STUB_ROLE_ID" ;;
  "ad sp show "*) [ -n "${STUB_SP:-}" ] && echo "$STUB_SP" || exit 3 ;;
  "ad sp create "*) echo sp-1 ;;
  "ad signed-in-user show "*) echo user-1 ;;
esac
exit 0
"""
AZD = """#!/bin/sh
printf 'azd %s\\n' "$*" >> "$STUB_LOG"
"""


def _run_hook(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in (("az", AZ), ("azd", AZD)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.log"
    log.write_text("")
    environment = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "STUB_LOG": str(log),
        "STUB_TENANT": TENANT_ID,
        "STUB_ROLE_ID": "role-1",
        "AZURE_ENV_NAME": "dev",
        "AZURE_SUBSCRIPTION_ID": "sub-1",
        **env,
    }
    done = subprocess.run(["sh", str(HOOK)], env=environment, capture_output=True, text=True, timeout=30)
    return done, log.read_text().splitlines()


def _body(call: str) -> dict[str, Any]:
    return json.loads(call.split("--body ", 1)[1])


def test_the_hook_creates_the_registration_with_the_role_and_requires_an_assignment(tmp_path: Path) -> None:
    done, calls = _run_hook(tmp_path)
    assert done.returncode == 0, done.stderr
    (create,) = [c for c in calls if c.startswith("ad app create ")]
    assert "--display-name orderflow-operators-dev --sign-in-audience AzureADMyOrg" in create
    (role,) = json.loads(create.split("--app-roles ", 1)[1].split(" --query", 1)[0])
    assert role["value"] == "Orders.Operator" and role["isEnabled"] is True
    assert sorted(role["allowedMemberTypes"]) == ["Application", "User"]
    assert "ad app update --id new-client --identifier-uris api://new-client" in calls
    patches = [_body(c) for c in calls if c.startswith("rest --method PATCH")]
    scope = patches[0]["api"]["oauth2PermissionScopes"][0]
    assert patches[0]["api"]["requestedAccessTokenVersion"] == 2 and scope["value"] == "user_impersonation"
    assert patches[1]["api"]["preAuthorizedApplications"] == [
        {"appId": AZURE_CLI_CLIENT_ID, "delegatedPermissionIds": [scope["id"]]}
    ]
    assert "ad sp create --id new-client --query id -o tsv" in calls
    assert "ad sp update --id new-client --set appRoleAssignmentRequired=true" in calls
    (assign,) = [c for c in calls if c.startswith("rest --method POST")]
    assert "/servicePrincipals/sp-1/appRoleAssignedTo" in assign
    assert _body(assign) == {"principalId": "user-1", "resourceId": "sp-1", "appRoleId": "role-1"}
    assert calls[-1] == "azd env set AUTH_CLIENT_ID new-client"
    assert not [c for c in calls if "secret" in c.lower() or "credential" in c.lower()]


def test_the_hook_keeps_an_existing_registration_and_only_requires_the_assignment(tmp_path: Path) -> None:
    done, calls = _run_hook(tmp_path, AUTH_CLIENT_ID="existing-1", STUB_SP="sp-9", ORDERFLOW_OPERATOR_APP_ROLE="Ops.X")
    assert done.returncode == 0, done.stderr
    assert not [c for c in calls if c.startswith(("ad app create", "ad app update", "rest ", "ad sp create"))]
    assert "ad app show --id existing-1 --query appRoles[?value=='Ops.X' && isEnabled] | [0].id -o tsv" in calls
    assert "ad sp update --id existing-1 --set appRoleAssignmentRequired=true" in calls
    assert calls[-1] == "azd env set AUTH_CLIENT_ID existing-1"


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"AUTH_CLIENT_ID": "existing-1", "STUB_ROLE_ID": ""}, "declares no enabled app role 'Orders.Operator'"),
        ({"STUB_SUBSCRIPTION_TENANT": "another-tenant"}, "az login --tenant another-tenant"),
    ],
    ids=["registration-without-the-role", "cli-in-another-tenant"],
)
def test_the_hook_stops_before_azd_deploys_with_a_registration_it_cannot_vouch_for(
    tmp_path: Path, env: dict[str, str], says: str
) -> None:
    done, calls = _run_hook(tmp_path, **env)
    assert done.returncode != 0 and says in done.stderr
    assert not [c for c in calls if c.startswith("azd env set")]
