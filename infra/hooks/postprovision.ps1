# azd postprovision hook (azure.yaml, Windows): the same check as postprovision.sh, which explains it. Lists the
# Azure Service Bus Data Sender and Data Owner assignments on orders-inbound (ORDERS_QUEUE_RESOURCE_ID) and on the
# namespace (SERVICEBUS_NAMESPACE_RESOURCE_ID); reports every principal but the declared ones (on the queue: the legacy
# app's LEGACY_ORDERS_APP_PRINCIPAL_ID, the function app's AZURE_APP_IDENTITY_PRINCIPAL_ID, the operators'
# OPERATOR_PRINCIPAL_ID; on the namespace: the function app's and the operators'), with the command that deletes each;
# deletes them with ORDERFLOW_PRUNE_SHARED_QUEUE_SENDERS=true. Until they are removed, isolation on the shared queue
# does not hold. Never fails the deployment: every error is a warning. docs/deploy.md, "Upgrading: stale senders on
# orders-inbound".
Set-StrictMode -Version Latest
$ErrorActionPreference = 'Continue'

$senderRole = '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'  # Azure Service Bus Data Sender
$ownerRole = '090c5cfd-751d-490a-894a-3ce6f1109419'   # Azure Service Bus Data Owner

function Say([string] $text) { [Console]::Error.WriteLine("postprovision: $text") }
function Warn([string] $text) { [Console]::Error.WriteLine("postprovision: WARNING: $text") }
function Lower([string] $text) { if ($text) { return $text.ToLowerInvariant() } else { return '' } }
# Whatever goes wrong, the deployment goes on: a warning, exit 0.
trap {
    Warn "the check of the senders on orders-inbound stopped: $_"
    exit 0
}
# az with its standard error kept apart (a warning on it would spoil the JSON): @{ out; code; err }.
function Invoke-Az {
    $errFile = New-TemporaryFile
    try {
        $out = & az @args 2> $errFile
        $code = $LASTEXITCODE
        $err = (Get-Content -Raw $errFile) -replace '\s+', ' '
    } finally { Remove-Item $errFile -ErrorAction SilentlyContinue }
    return @{ out = $out; code = $code; err = $err }
}

$queue = $env:ORDERS_QUEUE_RESOURCE_ID
$namespace = $env:SERVICEBUS_NAMESPACE_RESOURCE_ID
$legacyApp = if ($env:LEGACY_ORDERS_APP) { $env:LEGACY_ORDERS_APP } else { 'none' }
$legacy = Lower $env:LEGACY_ORDERS_APP_PRINCIPAL_ID
$functionApp = Lower $env:AZURE_APP_IDENTITY_PRINCIPAL_ID
$operators = Lower $env:OPERATOR_PRINCIPAL_ID
$prune = (Lower $env:ORDERFLOW_PRUNE_SHARED_QUEUE_SENDERS) -eq 'true'

if (-not $queue -or -not $namespace) {
    Warn 'ORDERS_QUEUE_RESOURCE_ID or SERVICEBUS_NAMESPACE_RESOURCE_ID is not in the azd environment: the senders on orders-inbound were not checked (docs/deploy.md, "Upgrading: stale senders on orders-inbound")'
    exit 0
}
if (-not (Get-Command az -ErrorAction SilentlyContinue)) {
    Warn "the Azure CLI (az) is not installed: the senders on orders-inbound were not checked. By hand: az role assignment list --scope $queue -o table"
    exit 0
}

$script:stale = 0
$script:deleted = 0
$script:failed = 0

function Check([string] $scope, [string] $grants, [string[]] $allowed) {
    $allowed = @($allowed | Where-Object { $_ })
    $list = Invoke-Az role assignment list --scope $scope -o json
    if ($list.code -ne 0) {
        Warn "could not list the role assignments on ${scope}: $($list.err)"
        Warn "check by hand: az role assignment list --scope $scope -o table (a Data Sender or Data Owner the template does not declare $grants)"
        $script:failed++
        return
    }
    try { $assignments = @(($list.out -join "`n") | ConvertFrom-Json) } catch {
        Warn "could not read the role assignments on ${scope}: $_"
        $script:failed++
        return
    }
    foreach ($a in $assignments) {
        $role = Lower $a.roleDefinitionId
        if ($role.EndsWith("/$senderRole")) { $roleName = 'Azure Service Bus Data Sender' }
        elseif ($role.EndsWith("/$ownerRole")) { $roleName = 'Azure Service Bus Data Owner' }
        else { continue }
        if ($allowed -contains (Lower $a.principalId)) { continue }
        $script:stale++
        $name = if ($a.PSObject.Properties['principalName'] -and $a.principalName) { " ($($a.principalName))" } else { '' }
        Warn "$($a.principalType) $($a.principalId)$name holds $roleName on ${scope}: it $grants. Remove it: az role assignment delete --ids $($a.id)"
        if ($prune) {
            $delete = Invoke-Az role assignment delete --ids $a.id
            if ($delete.code -eq 0) {
                Say "deleted the assignment $($a.id) ($roleName of $($a.principalId))"
                $script:deleted++
            } else {
                Warn "could not delete $($a.id): $($delete.err)"
                $script:failed++
            }
        }
    }
}

Check $queue "may send to orders-inbound as if it were the legacy app ($legacyApp)" @($legacy, $functionApp, $operators)
Check $namespace "may send to every queue of the namespace: orders-inbound as the legacy app, and every app's own inbound queue as that app" @($functionApp, $operators)

$remaining = $script:stale - $script:deleted
if ($script:stale -eq 0 -and $script:failed -eq 0) { Say 'orders-inbound and the namespace: no sender but the declared ones' }
if ($script:deleted -gt 0) { Say "deleted $($script:deleted) stale sender assignment(s) on orders-inbound and the namespace" }
if ($remaining -gt 0) {
    Warn "until these $remaining assignment(s) are removed, isolation on the shared queue orders-inbound does not hold: a principal other than the legacy app's can send orders there that count as the legacy app's."
    if (-not $prune) {
        Warn 'delete them with the commands above, or let this hook do it: azd env set ORDERFLOW_PRUNE_SHARED_QUEUE_SENDERS true; azd provision'
    }
} elseif ($script:failed -gt 0) {
    Warn 'the check did not complete (above): isolation on orders-inbound is not verified'
}
exit 0
