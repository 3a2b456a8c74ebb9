// Concern: the function app (Scheduler, Starter, Supervisor, Service Bus triggers) on Flex Consumption, Python
// 3.11, running as one user-assigned identity. Every connection is identity-based: no key, SAS or secret-bearing
// connection string appears in its settings. The app settings are exactly the ones the code reads
// (orderflow/settings.py SETTINGS) plus the ones the Functions host owns; tests/product/infra checks both sets.
// Operators sign in (App Service authentication, authsettingsV2 below): every HTTP request needs an Entra ID bearer
// token for the operator API's app registration (authClientId), validated by the platform before it reaches the
// worker; the code then requires the app role OperatorAppRole in the token's roles claim. With inboundPrivate (the
// private posture), the HTTP routes are reachable through the site's private endpoint only (main.bicep).
import { alwaysReadyEntry } from 'types.bicep'

param location string
param tags object = {}
param planName string
param functionAppName string
param identityId string
param identityClientId string

param storageBlobEndpoint string
param storageQueueEndpoint string
param storageTableEndpoint string
param deploymentContainerUrl string
param applicationInsightsConnectionString string
param logAnalyticsWorkspaceId string

param serviceBusFullyQualifiedNamespace string
@description('ARM resource id of the Service Bus namespace: the ops summary reads each queue\'s runtime counts there.')
param serviceBusNamespaceResourceId string
param cosmosEndpoint string
param ordersQueueName string
param agentRequestsQueueName string
param agentRepliesQueueName string
param operatorAlertsQueueName string
@description('SubmittingApps: the submitting apps\' names, comma-separated (each app\'s queues are <name>-orders and <name>-status).')
param submittingApps string
@description('LegacyOrdersApp: the app whose orders arrive on orders-inbound, or \'none\'.')
param legacyOrdersApp string
@description('MaxPendingOrdersPerApp: per-app backlog bounds, \'<app>=<N>,...\'; empty: each app gets MaxPendingOrders.')
param maxPendingOrdersPerApp string = ''
param ordersDatabaseName string
param ordersContainerName string
param stateDatabaseName string
param stateContainerName string
param checkpointContainerName string
@description('Container of the circuit-breaker documents (state database): the Starter reads them, the operator command writes them.')
param circuitBreakerContainerName string
@description('Container of the recovery index (state database): the Supervisor reads it in index mode; claims and step deadlines write it.')
param recoveryIndexContainerName string

@allowed([
  'AzureStorage'
  'DurableTaskScheduler'
])
param durableBackend string = 'AzureStorage'
param taskHubName string
@description('Durable Task Scheduler endpoint (durableBackend = DurableTaskScheduler only).')
param durableTaskSchedulerEndpoint string = ''

@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 100
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int = 2048
@description('Always-ready instances per group, e.g. [{ name: \'durable\', instanceCount: 1 }, { name: \'function:supervisor\', instanceCount: 1 }].')
param alwaysReady alwaysReadyEntry[] = []
@description('Extra or changed app settings (tunables such as StepTimeoutSeconds), merged over the defaults.')
param appSettingOverrides object = {}
@description('Private posture (main.bicep vnetEnabled): the \'app\' subnet (delegated to Microsoft.App/environments) the app integrates with; empty for none.')
param virtualNetworkSubnetId string = ''
@description('Private posture (main.bicep vnetEnabled): no public request reaches the app\'s HTTP routes; VNet clients use its private endpoint.')
param inboundPrivate bool = false
@description('With inboundPrivate: keep the deployment (SCM) endpoint public, Entra ID only (basic publishing credentials are off), so `azd deploy` works from outside the VNet. False: publicNetworkAccess Disabled, the site and its SCM endpoint are private (deploy from inside the VNet).')
param publicDeployment bool = true

@description('FinishedOrderRetentionSeconds: the Cosmos DB TTL a finished order\'s state record and stored order get (0: kept forever).')
@minValue(0)
param finishedOrderRetentionSeconds int = 7776000
@description('InstanceRetentionSeconds: finished Durable instances older than this are purged (0: never); the Durable Task Scheduler\'s retention policy follows it.')
@minValue(0)
param instanceRetentionSeconds int = 2592000
@description('SenderDeadLetterAlarmDepth: the dead-letters alarm\'s depth on a sender\'s queue; main.bicep passes the sender dead-letter alert\'s threshold (badInputThreshold).')
@minValue(1)
param senderDeadLetterAlarmDepth int = 20

@description('Client id of the operator API\'s Entra ID app registration (infra/hooks/preprovision.*): the audience of the bearer tokens App Service authentication accepts.')
param authClientId string
@description('Tenant of that app registration: only its tokens are accepted.')
param authTenantId string
@description('OperatorAppRole: the app role (value) a caller\'s token must carry in its roles claim for the operator routes.')
param operatorAppRole string

var useDurableTaskScheduler = durableBackend == 'DurableTaskScheduler'

// Settings the Functions host and platform read (not the app code).
var hostSettings = {
  AzureWebJobsStorage__blobServiceUri: storageBlobEndpoint
  AzureWebJobsStorage__queueServiceUri: storageQueueEndpoint
  AzureWebJobsStorage__tableServiceUri: storageTableEndpoint
  AzureWebJobsStorage__credential: 'managedidentity'
  AzureWebJobsStorage__clientId: identityClientId
  APPLICATIONINSIGHTS_CONNECTION_STRING: applicationInsightsConnectionString
  APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'ClientId=${identityClientId};Authorization=AAD'
  // host.json has telemetryMode OpenTelemetry and the app calls configure_azure_monitor itself (orderflow/telemetry.py):
  // the worker only reports the OpenTelemetry capability and propagates the host's trace context. Not
  // PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY, with which the worker would configure Azure Monitor a second time.
  PYTHON_ENABLE_OPENTELEMETRY: 'true'
  // The Service Bus extension's identity-based connection (the triggers' connection="ServiceBusConnection").
  ServiceBusConnection__credential: 'managedidentity'
  ServiceBusConnection__clientId: identityClientId
  // host.json: "hubName": "%TaskHubName%".
  TaskHubName: taskHubName
}

// The Durable Task Scheduler replaces the Azure Storage backend through host.json overrides; its connection string
// names an endpoint and an identity, never a secret. An override adds keys and removes none, so host.json declares no
// storageProvider (the default is Azure Storage on AzureWebJobsStorage): the effective section is exactly
// { type: azureManaged, connectionStringName }, with no stray connectionName.
var durableTaskSchedulerSettings = useDurableTaskScheduler ? {
  DURABLE_TASK_SCHEDULER_CONNECTION_STRING: 'Endpoint=${durableTaskSchedulerEndpoint};Authentication=ManagedIdentity;ClientID=${identityClientId}'
  AzureFunctionsJobHost__extensions__durableTask__storageProvider__type: 'azureManaged'
  AzureFunctionsJobHost__extensions__durableTask__storageProvider__connectionStringName: 'DURABLE_TASK_SCHEDULER_CONNECTION_STRING'
} : {}

// Settings the app code reads: names exactly as in orderflow/settings.py, values its defaults unless overridden.
var codeSettings = {
  ServiceBusConnection__fullyQualifiedNamespace: serviceBusFullyQualifiedNamespace
  // The ops summary's exact dead-letter depths: each queue's runtime counts from ARM, with Reader (rbac.bicep).
  ServiceBusNamespaceResourceId: serviceBusNamespaceResourceId
  CosmosDb__accountEndpoint: cosmosEndpoint
  CosmosDb__credential: 'managedidentity'
  CosmosDb__clientId: identityClientId
  AZURE_CLIENT_ID: identityClientId
  OrdersQueueName: ordersQueueName
  AgentRequestsQueueName: agentRequestsQueueName
  AgentRepliesQueueName: agentRepliesQueueName
  OperatorAlertsQueueName: operatorAlertsQueueName
  // Issue 25: each app's own queues (<name>-orders, <name>-status), the legacy app on orders-inbound, per-app bounds.
  SubmittingApps: submittingApps
  LegacyOrdersApp: legacyOrdersApp
  MaxPendingOrdersPerApp: maxPendingOrdersPerApp
  // The app role the operator routes require (authsettingsV2 below authenticates; the code authorizes).
  OperatorAppRole: operatorAppRole
  OrdersDatabaseName: ordersDatabaseName
  OrdersContainerName: ordersContainerName
  StateDatabaseName: stateDatabaseName
  StateContainerName: stateContainerName
  CheckpointContainerName: checkpointContainerName
  StepTimeoutSeconds: '30'
  ClaimLeaseSeconds: '60'
  StarterSchedule: '*/15 * * * * *'
  StarterBatchSize: '50'
  SupervisorSchedule: '*/10 * * * * *'
  SupervisorScanWindowSeconds: '3600'
  SupervisorPageSize: '100'
  SupervisorMaxResults: '500'
  FailureThreshold: '3'
  AgentRetriesPerStep: '4'
  RetryBackoffBaseSeconds: '2'
  RetryBackoffMaxSeconds: '300'
  // Issue 11: the retry budget (AgentRequestsMaxDeliveryCount must equal agent-requests' maxDeliveryCount in
  // servicebus.bicep; tests/product/infra/test_infra_servicebus.py), the circuit breaker (the Agent gets the same
  // values: agent.bicep) and admission control.
  RemoteCallBudgetPerStep: '75'
  AgentRequestsMaxDeliveryCount: '5'
  CircuitBreakerFailureThreshold: '10'
  CircuitBreakerWindowSeconds: '30'
  CircuitBreakerCooldownSeconds: '15'
  CircuitBreakerMaxCooldownSeconds: '300'
  CircuitBreakerProbes: '2'
  CircuitBreakerContainerName: circuitBreakerContainerName
  RemoteServiceName: 'fulfilment'
  MaxOrdersInProcessing: '100'
  MaxPendingOrders: '5000'
  // Issue 12: the recovery index (cosmos.bicep recoveryIndexContainer). `query` scans the state container across
  // partitions; `index` writes an index entry with every CompleteBy change and scans it one bucket (partition) at a
  // time. Switching a running system: docs/deploy.md, "Recovery index".
  SupervisorScanMode: 'query'
  RecoveryIndexContainerName: recoveryIndexContainerName
  RecoveryIndexBucketSeconds: '300'
  // Issue 26: data that ends (docs/deploy.md, "Retention and backup"). The two retentions are main.bicep parameters:
  // InstanceRetentionSeconds also sets the Durable Task Scheduler's retention policy (durable-task-scheduler.bicep).
  FinishedOrderRetentionSeconds: string(finishedOrderRetentionSeconds)
  InstanceRetentionSeconds: string(instanceRetentionSeconds)
  PurgeSchedule: '0 */5 * * * *'
  PurgeWindowSeconds: '3600'
  PurgeMaxInstancesPerCall: '500'
  PurgeMaxCallsPerRun: '8'
  // ...and alerts before anything is stuck: the app computes the alarms every AlarmSchedule tick and reports them as
  // the gauge orderflow.alarm.firing, which the alert rules of alerts.bicep read. SenderDeadLetterAlarmDepth is the
  // threshold of the sender dead-letter alert (alerts.bicep badInputThreshold): main.bicep passes one value to both.
  AlarmSchedule: '0 * * * * *'
  BacklogGrowthAlarmOrders: '100'
  BacklogGrowthWindowSeconds: '900'
  SenderDeadLetterAlarmDepth: string(senderDeadLetterAlarmDepth)
}

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'FC1'
    tier: 'FlexConsumption'
  }
  properties: {
    reserved: true
  }
}

resource functionApp 'Microsoft.Web/sites@2024-04-01' = {
  name: functionAppName
  location: location
  tags: union(tags, { 'azd-service-name': 'api' })
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    // Regional VNet integration (private posture): Storage, Service Bus and Cosmos DB are reached through their
    // private endpoints. Null, as if absent, otherwise.
    virtualNetworkSubnetId: !empty(virtualNetworkSubnetId) ? virtualNetworkSubnetId : null
    // Inbound (private posture): the site's private endpoint (main.bicep) is the way in; access restrictions do not
    // apply to it (https://learn.microsoft.com/azure/app-service/overview-access-restrictions). publicDeployment
    // false closes the public endpoint altogether, the SCM (deployment) endpoint with it. Null, as if absent, off.
    publicNetworkAccess: inboundPrivate ? (publicDeployment ? 'Enabled' : 'Disabled') : null
    siteConfig: {
      minTlsVersion: '1.2'
      ftpsState: 'Disabled'
      // Private posture: no public request reaches the app (no allow rule, unmatched traffic denied), while the
      // SCM endpoint keeps its own rules (publicDeployment: open to Entra ID-authenticated deployments only).
      ipSecurityRestrictionsDefaultAction: inboundPrivate ? 'Deny' : null
      scmIpSecurityRestrictionsUseMain: inboundPrivate ? false : null
      scmIpSecurityRestrictionsDefaultAction: inboundPrivate ? (publicDeployment ? 'Allow' : 'Deny') : null
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: deploymentContainerUrl
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identityId
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
        alwaysReady: alwaysReady
      }
      runtime: {
        name: 'python'
        version: '3.11'
      }
    }
  }
}

// Publishing with basic (user/password) credentials is off: deployments authenticate with Entra ID.
resource ftpCredentials 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: functionApp
  name: 'ftp'
  properties: {
    allow: false
  }
}

resource scmCredentials 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: functionApp
  name: 'scm'
  properties: {
    allow: false
  }
}

resource appSettings 'Microsoft.Web/sites/config@2024-04-01' = {
  parent: functionApp
  name: 'appsettings'
  properties: union(hostSettings, durableTaskSchedulerSettings, codeSettings, appSettingOverrides)
}

// Operators sign in: App Service authentication ("Easy Auth") with Microsoft Entra ID, token validation only. Every
// HTTP request without a valid bearer token for the app registration (audience authClientId or api://authClientId,
// issued by authTenantId's v2.0 endpoint) is answered 401 by the platform; nothing is excluded (excludedPaths): the
// operator routes (/api/orders..., /api/ops/summary, /api/openapi.json) and the Durable extension's public webhooks
// (/runtime/webhooks/durabletask, which the app never hands out) all need a token. The Service Bus and timer
// triggers do not come in over HTTP, and the Durable client inside the app reaches the extension over the host's
// local endpoint (rpcBaseUrl on localhost), not through the front end this runs in. No client secret: there is no
// browser login flow (Return401, no clientSecretSettingName), only bearer tokens. Easy Auth does not check app
// roles; the role is enforced twice: by Entra ID (the hook sets appRoleAssignmentRequired, so nobody without an
// assigned role gets a token) and by the code (the roles claim of X-MS-CLIENT-PRINCIPAL must hold OperatorAppRole).
// After the app settings: two writes of a site's config at once can fail with 409 Conflict, intermittently.
resource authSettings 'Microsoft.Web/sites/config@2024-04-01' = {
  parent: functionApp
  name: 'authsettingsV2'
  dependsOn: [
    appSettings
  ]
  properties: {
    platform: {
      enabled: true
    }
    globalValidation: {
      requireAuthentication: true
      unauthenticatedClientAction: 'Return401'
    }
    httpSettings: {
      requireHttps: true
    }
    identityProviders: {
      azureActiveDirectory: {
        enabled: true
        registration: {
          clientId: authClientId
          openIdIssuer: '${environment().authentication.loginEndpoint}${authTenantId}/v2.0'
        }
        validation: {
          allowedAudiences: [
            authClientId
            'api://${authClientId}'
          ]
        }
      }
    }
    login: {
      tokenStore: {
        enabled: false
      }
    }
  }
}

resource diagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: functionApp
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    logs: [
      {
        category: 'FunctionAppLogs'
        enabled: true
      }
    ]
    metrics: [
      {
        category: 'AllMetrics'
        enabled: true
      }
    ]
  }
}

output functionAppName string = functionApp.name
output functionAppId string = functionApp.id
output defaultHostName string = functionApp.properties.defaultHostName
