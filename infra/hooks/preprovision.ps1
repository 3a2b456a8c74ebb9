# azd preprovision hook (azure.yaml, Windows): the same steps as preprovision.sh, which explains them. The Microsoft
# Entra ID app registration of the operator API (no secret, no certificate): created with the app role
# ORDERFLOW_OPERATOR_APP_ROLE (default Orders.Operator) unless AUTH_CLIENT_ID names one already; its service principal
# requires an app role assignment; `azd env set AUTH_CLIENT_ID <client id>`. docs/deploy.md, "Operator sign-in".
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
function Body($value) { return ($value | ConvertTo-Json -Depth 10 -Compress) }
function Patch([string] $uri, $value) {
    $file = New-TemporaryFile
    try {
        Set-Content -Path $file -Value (Body $value) -Encoding utf8
        Az rest --method PATCH --uri $uri --headers 'Content-Type=application/json' --body "@$file" | Out-Null
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
    Az ad app update --id $clientId --identifier-uris "api://$clientId" | Out-Null
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

$roleId = Az ad app show --id $clientId --query "appRoles[?value=='$role' && isEnabled] | [0].id" -o tsv
if (-not $roleId) {
    Fail "the app registration $clientId declares no enabled app role '$role': add it (App roles, allowed member types Users/Groups and Applications) or choose another registration"
}

$spId = & az ad sp show --id $clientId --query id -o tsv 2> $null
if ($LASTEXITCODE -ne 0 -or -not $spId) { $spId = Az ad sp create --id $clientId --query id -o tsv }
Az ad sp update --id $clientId --set appRoleAssignmentRequired=true | Out-Null

if ($created -and $env:ORDERFLOW_OPERATOR_SELF_ASSIGN -ne 'false') {
    $me = & az ad signed-in-user show --query id -o tsv 2> $null
    if ($LASTEXITCODE -eq 0 -and $me) {
        Say "assigning the app role $role to the signed-in user $me"
        $file = New-TemporaryFile
        try {
            Set-Content -Path $file -Value (Body @{ principalId = $me; resourceId = $spId; appRoleId = $roleId }) -Encoding utf8
            Az rest --method POST --uri "$graph/servicePrincipals/$spId/appRoleAssignedTo" --headers 'Content-Type=application/json' --body "@$file" | Out-Null
        } finally { Remove-Item $file }
    } else {
        Say "signed in as a service principal: assign the app role $role to your operators (docs/deploy.md, ""Operator sign-in"")"
    }
}

& azd env set AUTH_CLIENT_ID $clientId
if ($LASTEXITCODE -ne 0) { Fail 'azd env set AUTH_CLIENT_ID failed' }
Say "AUTH_CLIENT_ID=$clientId (tenant $tenant)"
