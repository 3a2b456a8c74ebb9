#!/bin/sh
# azd postprovision hook (azure.yaml): who may still send to the shared orders-inbound queue beyond what main.bicep
# declares. Before issue 25 every submitting app held Azure Service Bus Data Sender on orders-inbound; Bicep is
# incremental, so an upgrade leaves those role assignments in place, and any such app can still send there as if it
# were the legacy app (an order on orders-inbound is the legacy app's). Until they are removed, isolation on the
# shared queue does not hold. docs/deploy.md, "Upgrading: stale senders on orders-inbound".
#
# Lists the role assignments of Azure Service Bus Data Sender and Data Owner (either grants send)
# - on the orders-inbound queue (ORDERS_QUEUE_RESOURCE_ID): every principal but the legacy app's while it may send
#   there (LEGACY_ORDERS_APP_PRINCIPAL_ID, '' once legacyOrdersQueueOpen is false or with no legacy app), the
#   function app's (AZURE_APP_IDENTITY_PRINCIPAL_ID) and the operators' (OPERATOR_PRINCIPAL_ID) is reported;
# - on the namespace (SERVICEBUS_NAMESPACE_RESOURCE_ID), where send reaches orders-inbound and every app's own queue:
#   every principal but the function app's and the operators' is reported (the legacy app's grant belongs on
#   orders-inbound, not on every queue).
# Each reported assignment is printed with the command that deletes it; with ORDERFLOW_PRUNE_SHARED_QUEUE_SENDERS=true
# in the azd environment (`azd env set ORDERFLOW_PRUNE_SHARED_QUEUE_SENDERS true`) the hook deletes them itself.
# The variables are main.bicep's outputs, which azd writes to the environment before this hook runs. The hook never
# fails the deployment: a missing output, a missing az, a listing or a deletion that fails is a warning.
set -u

sender_role="69a216fc-b8fb-44d8-bc22-1f3c2cd27a39" # Azure Service Bus Data Sender
owner_role="090c5cfd-751d-490a-894a-3ce6f1109419"  # Azure Service Bus Data Owner
tab="$(printf '\t')"

say() { printf 'postprovision: %s\n' "$*" >&2; }
warn() { printf 'postprovision: WARNING: %s\n' "$*" >&2; }
lower() { printf '%s' "$1" | tr 'A-Z' 'a-z'; }

queue="${ORDERS_QUEUE_RESOURCE_ID:-}"
namespace="${SERVICEBUS_NAMESPACE_RESOURCE_ID:-}"
legacy_app="${LEGACY_ORDERS_APP:-none}"
legacy="$(lower "${LEGACY_ORDERS_APP_PRINCIPAL_ID:-}")"
function_app="$(lower "${AZURE_APP_IDENTITY_PRINCIPAL_ID:-}")"
operators="$(lower "${OPERATOR_PRINCIPAL_ID:-}")"
case "$(lower "${ORDERFLOW_PRUNE_SHARED_QUEUE_SENDERS:-false}")" in
true) prune=true ;;
*) prune=false ;;
esac

if [ -z "$queue" ] || [ -z "$namespace" ]; then
    warn "ORDERS_QUEUE_RESOURCE_ID or SERVICEBUS_NAMESPACE_RESOURCE_ID is not in the azd environment: the senders on orders-inbound were not checked (docs/deploy.md, \"Upgrading: stale senders on orders-inbound\")"
    exit 0
fi
if ! command -v az >/dev/null 2>&1; then
    warn "the Azure CLI (az) is not installed: the senders on orders-inbound were not checked. By hand: az role assignment list --scope $queue -o table"
    exit 0
fi

work="$(mktemp -d)" || {
    warn "no temporary directory: the senders on orders-inbound were not checked"
    exit 0
}
trap 'rm -rf "$work"' EXIT
stale=0
deleted=0
failed=0

# check <scope> <what it grants> <principal ids allowed there, space-separated>
check() {
    scope="$1"
    grants="$2"
    allowed="$3"
    if ! az role assignment list --scope "$scope" \
        --query "[].[id, principalId, roleDefinitionId, principalType, principalName]" -o tsv \
        >"$work/list" 2>"$work/error"; then
        warn "could not list the role assignments on $scope: $(tr '\n' ' ' <"$work/error")"
        warn "check by hand: az role assignment list --scope $scope -o table (a Data Sender or Data Owner the template does not declare $grants)"
        failed=$((failed + 1))
        return 0
    fi
    while IFS="$tab" read -r id principal role type name; do
        [ -n "$id" ] || continue
        case "$(lower "$role")" in
        */"$sender_role") role_name="Azure Service Bus Data Sender" ;;
        */"$owner_role") role_name="Azure Service Bus Data Owner" ;;
        *) continue ;;
        esac
        principal_key="$(lower "$principal")"
        keep=false
        for ok in $allowed; do
            [ "$principal_key" = "$ok" ] && keep=true
        done
        [ "$keep" = true ] && continue
        stale=$((stale + 1))
        warn "$type $principal${name:+ ($name)} holds $role_name on $scope: it $grants. Remove it: az role assignment delete --ids $id"
        if [ "$prune" = true ]; then
            if az role assignment delete --ids "$id" </dev/null >/dev/null 2>"$work/error"; then
                say "deleted the assignment $id ($role_name of $principal)"
                deleted=$((deleted + 1))
            else
                warn "could not delete $id: $(tr '\n' ' ' <"$work/error")"
                failed=$((failed + 1))
            fi
        fi
    done <"$work/list"
}

check "$queue" "may send to orders-inbound as if it were the legacy app ($legacy_app)" "$legacy $function_app $operators"
check "$namespace" "may send to every queue of the namespace: orders-inbound as the legacy app, and every app's own inbound queue as that app" "$function_app $operators"

remaining=$((stale - deleted))
if [ "$stale" -eq 0 ] && [ "$failed" -eq 0 ]; then
    say "orders-inbound and the namespace: no sender but the declared ones"
fi
if [ "$deleted" -gt 0 ]; then
    say "deleted $deleted stale sender assignment(s) on orders-inbound and the namespace"
fi
if [ "$remaining" -gt 0 ]; then
    warn "until these $remaining assignment(s) are removed, isolation on the shared queue orders-inbound does not hold: a principal other than the legacy app's can send orders there that count as the legacy app's."
    if [ "$prune" != true ]; then
        warn "delete them with the commands above, or let this hook do it: azd env set ORDERFLOW_PRUNE_SHARED_QUEUE_SENDERS true && azd provision"
    fi
elif [ "$failed" -gt 0 ]; then
    warn "the check did not complete (above): isolation on orders-inbound is not verified"
fi
exit 0
