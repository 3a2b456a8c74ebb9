#!/bin/sh
# azd preprovision hook (azure.yaml): the Microsoft Entra ID app registration of the operator API, whose tokens the
# function app's App Service authentication validates (infra/app/function.bicep, authsettingsV2). Identity only: the
# registration has no client secret and no certificate.
#
# - AUTH_CLIENT_ID unset in the azd environment: creates the registration "orderflow-operators-<env>" (single tenant)
#   with the app role ORDERFLOW_OPERATOR_APP_ROLE (default Orders.Operator, for users and applications), the
#   identifier URI api://<client id>, v2.0 access tokens, a delegated scope user_impersonation pre-authorized for the
#   Azure CLI (so `az account get-access-token --scope api://<client id>/user_impersonation` needs no consent prompt),
#   its service principal, and assigns the role to the signed-in user (ORDERFLOW_OPERATOR_SELF_ASSIGN=false: nobody);
#   then `azd env set AUTH_CLIENT_ID <client id>` (main.parameters.json passes it as authClientId).
# - AUTH_CLIENT_ID set (a registration made earlier, by this hook or by you): checks that it declares the app role,
#   and changes nothing else about it.
# Either way its service principal requires an assignment (appRoleAssignmentRequired): Entra ID issues no token for the
# API to anyone who holds no app role of it, so the role is required before a request reaches Azure at all. The hook
# sets it only when it is not set yet, so a CI principal that does not own an existing service principal can run it.
# Microsoft Graph replicates a new application or service principal with a delay: a call right after `az ad app
# create` (or `az ad sp create`) may answer that the object does not exist. Those calls are retried (6 tries, 5 s
# apart) on such an answer only; any other error stops the hook at once.
#
# Needs the Azure CLI signed in (`az login`) to the tenant of the subscription azd deploys to, with the right to
# create app registrations (users can by default; a CI service principal needs Application.ReadWrite.OwnedBy), or an
# existing registration: `azd env set AUTH_CLIENT_ID <client id>`. docs/deploy.md, "Operator sign-in".
set -eu

role="${ORDERFLOW_OPERATOR_APP_ROLE:-Orders.Operator}"
# The Azure CLI's first-party client id (the same in every tenant).
azure_cli="04b07795-8ddb-461a-bbee-02f9e1bf7b46"

say() { printf 'preprovision: %s\n' "$*" >&2; }
fail() {
    say "$*"
    exit 1
}

# graph_call <command...>: the command, tried again while it fails because Graph does not show the object yet
# (replication delay after a create): 6 tries, 5 s apart. Its standard output is passed on once it succeeds; any other
# error, or the sixth not-found, stops the hook with the command's message.
graph_tries=6
graph_delay=5
graph_call() {
    try=1
    while :; do
        if out="$("$@" 2>"$graph_errors")"; then
            [ -z "$out" ] || printf '%s\n' "$out"
            return 0
        fi
        if [ "$try" -lt "$graph_tries" ] && grep -Eqi 'does not exist|not found|notfound' "$graph_errors"; then
            say "${1:-} ${2:-} ${3:-} ${4:-}: not visible in Microsoft Graph yet (replication delay), trying again in ${graph_delay} s ($try/$graph_tries)"
            try=$((try + 1))
            sleep "$graph_delay"
            continue
        fi
        cat "$graph_errors" >&2
        fail "${1:-} ${2:-} ${3:-} ${4:-} failed"
    done
}

new_guid() {
    if command -v uuidgen >/dev/null 2>&1; then
        uuidgen | tr 'A-Z' 'a-z'
    elif [ -r /proc/sys/kernel/random/uuid ]; then
        cat /proc/sys/kernel/random/uuid
    else
        python3 -c 'import uuid; print(uuid.uuid4())'
    fi
}

graph_errors="$(mktemp)"
trap 'rm -f "$graph_errors"' EXIT

command -v az >/dev/null 2>&1 || fail "the Azure CLI (az) is needed to create the operator API's app registration; or set one: azd env set AUTH_CLIENT_ID <client id>"
az account show --query id -o tsv >/dev/null 2>&1 || fail "the Azure CLI is not signed in: az login --tenant <the subscription's tenant>"

# The registration must live in the tenant whose tokens the function app accepts (authTenantId: the subscription's).
tenant="$(az account show --query tenantId -o tsv)"
if [ -n "${AZURE_SUBSCRIPTION_ID:-}" ]; then
    wanted="$(az account show --subscription "$AZURE_SUBSCRIPTION_ID" --query tenantId -o tsv 2>/dev/null || true)"
    if [ -n "$wanted" ] && [ "$wanted" != "$tenant" ]; then
        fail "the Azure CLI is signed in to tenant $tenant, the subscription $AZURE_SUBSCRIPTION_ID is in $wanted: az login --tenant $wanted"
    fi
fi
graph="$(az cloud show --query endpoints.microsoftGraphResourceId -o tsv 2>/dev/null || true)"
graph="${graph:-https://graph.microsoft.com/}"
graph="${graph%/}/v1.0"

client_id="${AUTH_CLIENT_ID:-}"
if [ -z "$client_id" ]; then
    name="orderflow-operators-${AZURE_ENV_NAME:-orderflow}"
    say "creating the app registration $name with the app role $role"
    roles="[{\"allowedMemberTypes\":[\"User\",\"Application\"],\"displayName\":\"orderflow operator\",\"description\":\"May call the orderflow operator API (orders, resubmit, cancel, summary).\",\"isEnabled\":true,\"value\":\"$role\"}]"
    client_id="$(az ad app create --display-name "$name" --sign-in-audience AzureADMyOrg --app-roles "$roles" --query appId -o tsv)"
    [ -n "$client_id" ] || fail "az ad app create returned no appId"
    graph_call az ad app update --id "$client_id" --identifier-uris "api://$client_id"
    scope_id="$(new_guid)"
    graph_call az rest --method PATCH --uri "$graph/applications(appId='$client_id')" --headers "Content-Type=application/json" \
        --body "{\"api\":{\"requestedAccessTokenVersion\":2,\"oauth2PermissionScopes\":[{\"id\":\"$scope_id\",\"value\":\"user_impersonation\",\"type\":\"User\",\"isEnabled\":true,\"adminConsentDisplayName\":\"Call the orderflow operator API\",\"adminConsentDescription\":\"Call the orderflow operator API as the signed-in user.\",\"userConsentDisplayName\":\"Call the orderflow operator API\",\"userConsentDescription\":\"Call the orderflow operator API as you.\"}]}}"
    graph_call az rest --method PATCH --uri "$graph/applications(appId='$client_id')" --headers "Content-Type=application/json" \
        --body "{\"api\":{\"preAuthorizedApplications\":[{\"appId\":\"$azure_cli\",\"delegatedPermissionIds\":[\"$scope_id\"]}]}}"
    created=true
else
    say "using the app registration $client_id (AUTH_CLIENT_ID)"
    created=false
fi

# Retried only for a registration just created: for AUTH_CLIENT_ID, "does not exist" means a wrong id.
role_query="appRoles[?value=='$role' && isEnabled] | [0].id"
if [ "$created" = true ]; then
    role_id="$(graph_call az ad app show --id "$client_id" --query "$role_query" -o tsv)"
else
    role_id="$(az ad app show --id "$client_id" --query "$role_query" -o tsv)"
fi
[ -n "$role_id" ] || fail "the app registration $client_id declares no enabled app role '$role': add it (App roles, allowed member types Users/Groups and Applications) or choose another registration"

sp_id="$(az ad sp show --id "$client_id" --query id -o tsv 2>/dev/null || true)"
if [ -z "$sp_id" ]; then
    sp_id="$(graph_call az ad sp create --id "$client_id" --query id -o tsv)"
    required=false
else
    # az prints a boolean as True or False in tsv.
    required="$(az ad sp show --id "$client_id" --query appRoleAssignmentRequired -o tsv | tr 'A-Z' 'a-z')"
fi
if [ "$required" = true ]; then
    say "its service principal $sp_id already requires an app role assignment"
else
    graph_call az ad sp update --id "$client_id" --set appRoleAssignmentRequired=true
fi

if [ "$created" = true ] && [ "${ORDERFLOW_OPERATOR_SELF_ASSIGN:-true}" != false ]; then
    me="$(az ad signed-in-user show --query id -o tsv 2>/dev/null || true)"
    if [ -n "$me" ]; then
        say "assigning the app role $role to the signed-in user $me"
        graph_call az rest --method POST --uri "$graph/servicePrincipals/$sp_id/appRoleAssignedTo" --headers "Content-Type=application/json" \
            --body "{\"principalId\":\"$me\",\"resourceId\":\"$sp_id\",\"appRoleId\":\"$role_id\"}" >/dev/null
    else
        say "signed in as a service principal: assign the app role $role to your operators (docs/deploy.md, \"Operator sign-in\")"
    fi
fi

azd env set AUTH_CLIENT_ID "$client_id"
say "AUTH_CLIENT_ID=$client_id (tenant $tenant)"
