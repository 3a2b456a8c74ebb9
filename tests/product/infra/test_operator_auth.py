"""Operators sign in (issue 25): the function app has App Service authentication ("Easy Auth", authsettingsV2) with
Microsoft Entra ID, read from the Bicep tree as main.bicep deploys it: every request needs a bearer token for the
operator API's app registration (requireAuthentication, Return401, no excluded path, no client secret), an empty
authClientId fails the deployment, and the operator app role is required twice: by Entra ID (the azd preprovision hook
declares the role and sets appRoleAssignmentRequired on the service principal) and by the code (app setting
OperatorAppRole, the role the routes check in the caller's roles claim). The hook itself runs here against stand-ins
of `az`, `azd` and `sleep` that record every call: it waits out Graph's replication delay after a create, and it
leaves a service principal that already requires an assignment alone. The auth settings are written after the app
settings, and the docs call the routes the app serves, with a function key and the token of OPERATOR_API_SCOPE.
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
    depends_on,
    evaluate,
    main,
    module_scope,
    with_values,
)

from orderflow import openapi, ops_http

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


def test_the_auth_settings_are_written_after_the_app_settings() -> None:
    """Two writes of one site's config at once (appsettings and authsettingsV2) intermittently fail with 409
    Conflict: the auth settings wait for the app settings."""
    function = app("function.bicep")
    assert "appSettings" in depends_on(function.resource("authSettings"))
    assert not depends_on(function.resource("appSettings")) & {"authSettings"}


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

# Answers of the az stand-in by the start of its arguments (the first that matches); every call is logged. A command
# starting with STUB_FLAKY fails its first STUB_FLAKY_TIMES calls with STUB_FLAKY_ERROR (default: Graph's answer for
# an object it does not show yet).
NOT_REPLICATED = (
    "ERROR: Resource '7c0a4e3e' does not exist or one of its queried reference-property objects are not present."
)
AZ = r"""#!/bin/sh
printf '%s\n' "$*" >> "$STUB_LOG"
if [ -n "${STUB_FLAKY:-}" ]; then
  case "$*" in
    "$STUB_FLAKY"*)
      echo x >> "$STUB_LOG.flaky"
      if [ $(wc -l < "$STUB_LOG.flaky") -le "$STUB_FLAKY_TIMES" ]; then echo "$STUB_FLAKY_ERROR" >&2; exit 1; fi ;;
  esac
fi
case "$*" in
  "account show --query id -o tsv") echo sub-1 ;;
  "account show --query tenantId -o tsv") echo "$STUB_TENANT" ;;
  "account show --subscription "*) echo "${STUB_SUBSCRIPTION_TENANT:-$STUB_TENANT}" ;;
  "cloud show "*) echo https://graph.microsoft.com/ ;;
  "ad app create "*) echo new-client ;;
  "ad app show "*) echo "$STUB_ROLE_ID" ;;
  "ad sp show "*"--query appRoleAssignmentRequired "*) echo "${STUB_SP_REQUIRED:-False}" ;;
  "ad sp show "*) [ -n "${STUB_SP:-}" ] && echo "$STUB_SP" || exit 3 ;;
  "ad sp create "*) echo sp-1 ;;
  "ad signed-in-user show "*) echo user-1 ;;
esac
exit 0
"""
AZD = """#!/bin/sh
printf 'azd %s\\n' "$*" >> "$STUB_LOG"
"""
# The hook waits between Graph retries: the stand-in only records how long.
SLEEP = """#!/bin/sh
printf 'sleep %s\\n' "$*" >> "$STUB_LOG"
"""


def _run_hook(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in (("az", AZ), ("azd", AZD), ("sleep", SLEEP)):
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
        "STUB_FLAKY_ERROR": NOT_REPLICATED,
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
    assert "ad sp show --id existing-1 --query appRoleAssignmentRequired -o tsv" in calls
    assert "ad sp update --id existing-1 --set appRoleAssignmentRequired=true" in calls
    assert calls[-1] == "azd env set AUTH_CLIENT_ID existing-1"


@pytest.mark.parametrize("shown", ["True", "true"])
def test_the_hook_leaves_a_service_principal_that_already_requires_an_assignment(tmp_path: Path, shown: str) -> None:
    """A CI principal that does not own the service principal may not update it: the hook reads the flag and writes
    it only when it is not set yet (az prints a boolean as True in tsv)."""
    done, calls = _run_hook(tmp_path, AUTH_CLIENT_ID="existing-1", STUB_SP="sp-9", STUB_SP_REQUIRED=shown)
    assert done.returncode == 0, done.stderr
    assert "ad sp show --id existing-1 --query appRoleAssignmentRequired -o tsv" in calls
    assert not [c for c in calls if c.startswith("ad sp update")]
    assert "already requires an app role assignment" in done.stderr
    assert calls[-1] == "azd env set AUTH_CLIENT_ID existing-1"


# The calls right after `az ad app create` (or `az ad sp create`) that Graph may answer "does not exist" for a while.
AFTER_CREATE = [
    "ad app update",
    "rest --method PATCH",
    "ad app show",
    "ad sp create",
    "ad sp update",
    "rest --method POST",
]


@pytest.mark.parametrize("command", AFTER_CREATE)
def test_the_hook_waits_for_graph_to_show_a_new_object(tmp_path: Path, command: str) -> None:
    def of_command(calls: list[str]) -> list[str]:  # the scope's id is a new GUID each run
        return [
            re.sub(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", "<guid>", c) for c in calls if c.startswith(command)
        ]

    (tmp_path / "plain").mkdir()
    expected = of_command(_run_hook(tmp_path / "plain")[1])
    done, calls = _run_hook(tmp_path, STUB_FLAKY=command, STUB_FLAKY_TIMES="2")
    assert done.returncode == 0, done.stderr
    assert of_command(calls) == expected[:1] * 2 + expected  # two failed tries, then as without the delay
    assert [c for c in calls if c.startswith("sleep")] == ["sleep 5", "sleep 5"]
    assert "not visible in Microsoft Graph yet" in done.stderr and "(1/6)" in done.stderr and "(2/6)" in done.stderr
    assert calls[-1] == "azd env set AUTH_CLIENT_ID new-client"


def test_the_hook_gives_up_after_six_tries(tmp_path: Path) -> None:
    done, calls = _run_hook(tmp_path, STUB_FLAKY="ad sp create", STUB_FLAKY_TIMES="99")
    assert done.returncode != 0
    assert len([c for c in calls if c.startswith("ad sp create")]) == 6
    assert [c for c in calls if c.startswith("sleep")] == ["sleep 5"] * 5
    assert NOT_REPLICATED in done.stderr and "az ad sp create failed" in done.stderr
    assert not [c for c in calls if c.startswith("azd env set")]


@pytest.mark.parametrize("command", ["ad app update", "ad sp update"])
def test_any_other_graph_error_stops_the_hook_at_once(tmp_path: Path, command: str) -> None:
    refusal = "ERROR: Insufficient privileges to complete the operation."
    done, calls = _run_hook(tmp_path, STUB_FLAKY=command, STUB_FLAKY_TIMES="99", STUB_FLAKY_ERROR=refusal)
    assert done.returncode != 0 and refusal in done.stderr
    assert len([c for c in calls if c.startswith(command)]) == 1
    assert not [c for c in calls if c.startswith(("sleep", "azd env set"))]


def test_a_wrong_auth_client_id_is_not_waited_for(tmp_path: Path) -> None:
    """For a registration the hook did not just create, "does not exist" means a wrong AUTH_CLIENT_ID: no retry."""
    done, calls = _run_hook(tmp_path, AUTH_CLIENT_ID="typo-1", STUB_FLAKY="ad app show", STUB_FLAKY_TIMES="99")
    assert done.returncode != 0
    assert len([c for c in calls if c.startswith("ad app show")]) == 1
    assert not [c for c in calls if c.startswith(("sleep", "azd env set"))]


def test_the_windows_hook_retries_and_checks_the_flag_alike() -> None:
    source = HOOK.with_suffix(".ps1").read_text()
    assert "function AzGraph" in source and "Start-Sleep -Seconds 5" in source and "$try -lt 6" in source
    assert "'does not exist|not found|notfound'" in source
    for command in ("ad app update", "rest --method PATCH", "ad sp create", "ad sp update", "rest --method POST"):
        assert re.search(rf"AzGraph {command}", source), command
    assert "--query appRoleAssignmentRequired -o tsv" in source and "if ($required -eq 'true')" in source
    sh = HOOK.read_text()
    assert "graph_tries=6" in sh and "graph_delay=5" in sh and "'does not exist|not found|notfound'" in sh


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


# ---------------------------------------------------------------- the docs call the API as it is served


def _section(doc: str, heading: str) -> str:
    match = re.search(rf"^{re.escape(heading)}\n(.*?)(?=^#{{2,3}} )", doc, re.MULTILINE | re.DOTALL)
    assert match, heading
    return match.group(1)


def test_the_docs_call_the_served_routes_with_a_key_and_the_same_token() -> None:
    deploy = (REPO / "docs" / "deploy.md").read_text()
    operations = (REPO / "docs" / "operations.md").read_text()
    sign_in = _section(deploy, "### Operator sign-in")
    for route in (openapi.ROUTE_ORDERS, openapi.ROUTE_SUMMARY, openapi.ROUTE_OPENAPI):
        assert f"`/api/{route}`" in sign_in, route
    assert "/api/summary" not in deploy + operations and "/api/summary" not in app("function.bicep").path.read_text()
    # Every curl to the API sends the function key and the bearer token.
    curls = re.findall(r"^curl .*?(?<!\\)$", sign_in, re.MULTILINE | re.DOTALL)
    assert curls and all("x-functions-key: $key" in c and "Authorization: Bearer $token" in c for c in curls), curls
    # ... to a route the app serves (OPERATOR_API_URL ends in /api).
    served = {openapi.ROUTE_ORDERS, openapi.ROUTE_SUMMARY, openapi.ROUTE_OPENAPI}
    called = {re.split(r"[?\"]", c.split("OPERATOR_API_URL)/", 1)[1])[0] for c in curls}
    assert called and called <= served, called - served
    # One token command, in both documents: the scope azd outputs as OPERATOR_API_SCOPE.
    assert evaluate(main().outputs["OPERATOR_API_SCOPE"], _main_scope(authClientId=CLIENT_ID)) == (
        f"api://{CLIENT_ID}/user_impersonation"
    )
    command = 'az account get-access-token --scope "$(azd env get-value OPERATOR_API_SCOPE)" --query accessToken -o tsv'
    assert command in sign_in and command in operations
    assert "api://<client id>/user_impersonation" in sign_in and "api://<client id>/user_impersonation" in operations
    assert "--resource api://" not in deploy + operations
    # The private posture's deployment endpoint, said where operators read.
    assert "With `vnetEnabled` and the default `functionPublicDeployment=true`, the function app's SCM" in " ".join(
        sign_in.split()
    )
    assert "Entra ID only" in sign_in
