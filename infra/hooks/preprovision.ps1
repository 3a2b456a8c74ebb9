# azd preprovision hook (azure.yaml, Windows): the same steps as preprovision.sh, which explains them. The Microsoft
# Entra ID app registration of the operator API (no secret, no certificate): created with the app role
# ORDERFLOW_OPERATOR_APP_ROLE (default Orders.Operator) unless AUTH_CLIENT_ID names one already; its service principal
# requires an app role assignment (set only when it is not set yet); `azd env set AUTH_CLIENT_ID <client id>`. Calls
# right after a create are retried on Graph's replication delay ("does not exist": 6 tries, 5 s apart).
# docs/deploy.md, "Operator sign-in".
$ErrorActionPreference = 'Stop'
Set-StrictMode -Version Latest

$role = if ($env:ORDERFLOW_OPERATOR_APP_ROLE) { $env:ORDERFLOW_OPERATOR_APP_ROLE } else { 'Orders.Operator' }
$azureCli = '04b07795-8ddb-461a-bbee-02f9e1bf7b46'  # the Azure CLI's first-party client id

function Say([string] $text) { [Console]::Error.WriteLine("preprovision: $text") }
function Fail([string] $text) { Say $text; exit 1 }
# az, failing the hook on a non-zero exit code (a native command does not throw in PowerShell).
function Az {
    $out = & az @args
    if ($LASTEXITCODE -ne 0) { Fail "az $($args -join ' ') failed ($LASTEXITCODE)" }
    return $out
}
# az, tried again while it fails because Microsoft Graph does not show the object yet (the replication delay after
# `az ad app create` or `az ad sp create`): 6 tries, 5 s apart, on a "does not exist" / "not found" answer only; any
# other error, or the sixth not-found, fails the hook with az's message.
function AzGraph {
    for ($try = 1; ; $try++) {
        $errFile = New-TemporaryFile
        try {
            $out = & az @args 2> $errFile
            $code = $LASTEXITCODE
            $err = Get-Content -Raw $errFile
        } finally { Remove-Item $errFile }
        if ($code -eq 0) { return $out }
        if ($try -lt 6 -and $err -match 'does not exist|not found|notfound') {
            Say "az $($args[0..2] -join ' '): not visible in Microsoft Graph yet (replication delay), trying again in 5 s ($try/6)"
            Start-Sleep -Seconds 5
            continue
        }
        if ($err) { [Console]::Error.Write($err) }
        Fail "az $($args[0..2] -join ' ') failed ($code)"
    }
}
function Body($value) { return ($value | ConvertTo-Json -Depth 10 -Compress) }
function Patch([string] $uri, $value) {
    $file = New-TemporaryFile
    try {
        Set-Content -Path $file -Value (Body $value) -Encoding utf8
        AzGraph rest --method PATCH --uri $uri --headers 'Content-Type=application/json' --body "@$file" | Out-Null
    } finally { Remove-Item $file }
}

if (-not (Get-Command az -ErrorAction SilentlyContinue)) {
    Fail 'the Azure CLI (az) is needed to create the operator API''s app registration; or set one: azd env set AUTH_CLIENT_ID <client id>'
}
& az account show --query id -o tsv *> $null
if ($LASTEXITCODE -ne 0) { Fail 'the Azure CLI is not signed in: az login --tenant <the subscription''s tenant>' }

$tenant = Az account show --query tenantId -o tsv
if ($env:AZURE_SUBSCRIPTION_ID) {
    $wanted = & az account show --subscription $env:AZURE_SUBSCRIPTION_ID --query tenantId -o tsv 2> $null
    if ($LASTEXITCODE -eq 0 -and $wanted -and $wanted -ne $tenant) {
        Fail "the Azure CLI is signed in to tenant $tenant, the subscription $($env:AZURE_SUBSCRIPTION_ID) is in ${wanted}: az login --tenant $wanted"
    }
}
$graph = & az cloud show --query endpoints.microsoftGraphResourceId -o tsv 2> $null
if ($LASTEXITCODE -ne 0 -or -not $graph) { $graph = 'https://graph.microsoft.com/' }
$graph = $graph.TrimEnd('/') + '/v1.0'

$clientId = $env:AUTH_CLIENT_ID
$created = $false
if (-not $clientId) {
    $name = "orderflow-operators-$(if ($env:AZURE_ENV_NAME) { $env:AZURE_ENV_NAME } else { 'orderflow' })"
    Say "creating the app registration $name with the app role $role"
    $roles = Body @(@{
            allowedMemberTypes = @('User', 'Application')
            displayName        = 'orderflow operator'
            description        = 'May call the orderflow operator API (orders, resubmit, cancel, summary).'
            isEnabled          = $true
            value              = $role
        })
    $rolesFile = New-TemporaryFile
    try {
        Set-Content -Path $rolesFile -Value $roles -Encoding utf8
        $clientId = Az ad app create --display-name $name --sign-in-audience AzureADMyOrg --app-roles "@$rolesFile" --query appId -o tsv
    } finally { Remove-Item $rolesFile }
    if (-not $clientId) { Fail 'az ad app create returned no appId' }
    AzGraph ad app update --id $clientId --identifier-uris "api://$clientId" | Out-Null
    $scopeId = [guid]::NewGuid().ToString()
    Patch "$graph/applications(appId='$clientId')" @{ api = @{
            requestedAccessTokenVersion = 2
            oauth2PermissionScopes      = @(@{
                    id                      = $scopeId
                    value                   = 'user_impersonation'
                    type                    = 'User'
                    isEnabled               = $true
                    adminConsentDisplayName = 'Call the orderflow operator API'
                    adminConsentDescription = 'Call the orderflow operator API as the signed-in user.'
                    userConsentDisplayName  = 'Call the orderflow operator API'
                    userConsentDescription  = 'Call the orderflow operator API as you.'
                })
        }
    }
    Patch "$graph/applications(appId='$clientId')" @{ api = @{
            preAuthorizedApplications = @(@{ appId = $azureCli; delegatedPermissionIds = @($scopeId) })
        }
    }
    $created = $true
} else {
    Say "using the app registration $clientId (AUTH_CLIENT_ID)"
}

# Retried only for a registration just created: for AUTH_CLIENT_ID, "does not exist" means a wrong id.
$roleQuery = "appRoles[?value=='$role' && isEnabled] | [0].id"
$roleId = if ($created) { AzGraph ad app show --id $clientId --query $roleQuery -o tsv } else { Az ad app show --id $clientId --query $roleQuery -o tsv }
if (-not $roleId) {
    Fail "the app registration $clientId declares no enabled app role '$role': add it (App roles, allowed member types Users/Groups and Applications) or choose another registration"
}

$spId = & az ad sp show --id $clientId --query id -o tsv 2> $null
if ($LASTEXITCODE -ne 0 -or -not $spId) {
    $spId = AzGraph ad sp create --id $clientId --query id -o tsv
    $required = 'false'
} else {
    # Set only when it is not set yet: a CI principal that does not own the service principal cannot update it.
    $required = Az ad sp show --id $clientId --query appRoleAssignmentRequired -o tsv
}
if ($required -eq 'true') {
    Say "its service principal $spId already requires an app role assignment"
} else {
    AzGraph ad sp update --id $clientId --set appRoleAssignmentRequired=true | Out-Null
}

if ($created -and $env:ORDERFLOW_OPERATOR_SELF_ASSIGN -ne 'false') {
    $me = & az ad signed-in-user show --query id -o tsv 2> $null
    if ($LASTEXITCODE -eq 0 -and $me) {
        Say "assigning the app role $role to the signed-in user $me"
        $file = New-TemporaryFile
        try {
            Set-Content -Path $file -Value (Body @{ principalId = $me; resourceId = $spId; appRoleId = $roleId }) -Encoding utf8
            AzGraph rest --method POST --uri "$graph/servicePrincipals/$spId/appRoleAssignedTo" --headers 'Content-Type=application/json' --body "@$file" | Out-Null
        } finally { Remove-Item $file }
    } else {
        Say "signed in as a service principal: assign the app role $role to your operators (docs/deploy.md, ""Operator sign-in"")"
    }
}

& azd env set AUTH_CLIENT_ID $clientId
if ($LASTEXITCODE -ne 0) { Fail 'azd env set AUTH_CLIENT_ID failed' }
Say "AUTH_CLIENT_ID=$clientId (tenant $tenant)"
