// Concern: every grant (data plane; Reader for queue counts), in one place, least privilege. Each principal gets
// exactly the roles it needs, scoped to the one resource (queue, account, database, container, registry) it uses. No
// Service Bus Data Owner, no Contributor, no key. Role assignment names are guid(scope, principal, role): stable
// across redeployments.
//
//  principal        | grant                                  | scope                     | why (what the code does)
//  function app     | Service Bus Data Receiver              | each app's inbound queue  | submission-<app> triggers
//  function app     | Service Bus Data Receiver              | orders-inbound            | submission trigger (legacy)
//  function app     | Service Bus Data Receiver              | agent-replies             | replies trigger
//  function app     | Service Bus Data Sender                | agent-requests            | the Scheduler's requests
//  function app     | Service Bus Data Sender                | operator-alerts           | alerts (poison, escalation)
//  function app     | Service Bus Data Sender                | each status queue         | order status messages
//  function app     | Reader                                 | each of those queues      | summary: exact DLQ counts
//  function app     | Storage Blob Data Owner                | host storage account      | host, deployment package
//  function app     | Storage Queue + Table Data Contributor | the same account          | Durable hub (AzureStorage)
//  function app     | Monitoring Metrics Publisher           | Application Insights      | telemetry (Entra ID)
//  function app     | Cosmos DB Built-in Data Contributor    | databases orders, state   | every store read, write
//  Agent            | Service Bus Data Receiver              | agent-requests            | its session receiver
//  Agent            | Service Bus Data Sender                | agent-replies             | its replies
//  Agent            | Service Bus Data Sender                | operator-alerts           | its poison alerts
//  Agent            | AcrPull                                | container registry        | its container image
//  Agent            | Monitoring Metrics Publisher           | Application Insights      | telemetry (Entra ID)
//  Agent            | orderflow circuit breaker (custom)     | container circuitBreakers | the breaker documents
//  submitting app   | Service Bus Data Sender                | its own inbound queue     | SubmitOrder, CancelOrder
//  legacy app only  | Service Bus Data Sender                | orders-inbound            | as before per-app queues
//  submitting app   | Service Bus Data Receiver              | its own status queue only | its order statuses
//  operators (opt.) | Service Bus Data Receiver              | the namespace             | alerts, dlq list|show|replay
//  operators (opt.) | Service Bus Data Sender                | the namespace             | dlq replay, cancel, breaker
//  operators (opt.) | Cosmos DB Built-in Data Reader         | database orders           | orderflow order
//  operators (opt.) | custom: read, replace items            | container orders          | orderflow keep (ttl -1)
//  operators (opt.) | Cosmos DB Built-in Data Contributor    | database state            | order(s), resubmit, breaker
// Service Bus rights are per queue, and a queue's dead-letter sub-queue (<queue>/$deadletterqueue) is part of it
// (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-dead-letter-queues). A receive, a peek included,
// needs Data Receiver (Microsoft.ServiceBus/*/receive/action), a send Data Sender (.../send/action)
// (https://learn.microsoft.com/azure/role-based-access-control/built-in-roles/integration). The ops summary's
// dead-letter depths are the control plane's runtime counts of each queue (GET .../queues/{queue}, properties.
// countDetails.deadLetterMessageCount: https://learn.microsoft.com/rest/api/servicebus/controlplane-stable/queues/get),
// read with Reader (`*/read`, no data action: https://learn.microsoft.com/azure/role-based-access-control/built-in-roles/
// general#reader) on each queue the summary reads: Microsoft.ServiceBus/namespaces/queues/read shows the queue's
// properties and counts, never a message (receive is a data action) nor a key (listKeys is a POST action, not a read).
// Reader on every summary queue, the two the app may also peek included, is the one uniform, exact source (a peek
// stops at a cap); scoped per queue, not to the namespace. Not granted on purpose: Send on orders-inbound to the app
// (the operator cancel route applies the cancel through the CancelOrder use case and sends nothing), Listen on
// agent-requests, operator-alerts or a status queue to the app (the summary does not peek them), and any Manage
// right. tests/product/infra/test_rbac_operations.py checks every Service Bus call and every queue ARM read of the
// deployed code against these grants.
// Submitting apps (issue 25): Service Bus does not stamp a message with its sender, so the queue names the app: each
// app may send to its own inbound queue "<name>-orders" only, never to another app's, and read its own status queue
// only. orders-inbound, the one queue every app sent to before, stays for the legacy app (legacyOrdersApp, the app
// that owned every order then) and nobody else, until it has moved to its own queue (legacyOrdersQueueOpen false);
// with no legacy app ('') nobody may send there and the function app does not read it (no submission trigger is
// registered on it). Bicep is incremental: an app's former Send on
// orders-inbound from a deployment before issue 25 is not deleted by this one, and until it is, that app can send
// there as the legacy app: azd's postprovision hook (infra/hooks/postprovision.sh) reports every such grant and, with
// ORDERFLOW_PRUNE_SHARED_QUEUE_SENDERS=true, deletes it (docs/deploy.md, "Upgrading: stale senders on orders-inbound").
// tests/product/infra/test_submitter_rights.py checks each app's send rights for two and three apps.
// The Agent touches one Cosmos DB container, the circuit-breaker documents (issue 11): a custom data-plane role lets it
// read, create and replace items there and nothing else (no delete, upsert, query or change feed; no other container;
// not the orders or the order state). The function app reads and writes the breakers through its Data Contributor
// grant on the state database, which holds that container. The same grant covers the recovery index (issue 12,
// container recoveryIndex of database state: the Supervisor queries and deletes entries, claims and step deadlines
// write them); the Agent has no grant there. The Durable Task Scheduler grant (when chosen) is in
// durable-task-scheduler.bicep, beside the task hub it is scoped to.
// The operators' grants are what the operator CLI does with their own identity (orderflow/cli: README "Operating"):
// it reads and replays the dead letters of every queue (status queues included), sends a cancel to orders-inbound and
// a breaker alert to operator-alerts, reads the orders and the state store and writes a resubmit and the breaker
// documents. Every queue is theirs to read and replay to, so both Service Bus roles are scoped to the namespace (no
// Manage: Data Sender and Data Receiver only). Locally the stand-ins give the `operators` identity exactly these
// rights (orderflow/embedded/rights), so a command that needs more fails there as on Azure.

import { submittingApp } from 'types.bicep'

@description('Principal ids: the user-assigned identities of the function app and of the Agent.')
param appPrincipalId string
param agentPrincipalId string
@description('Submitting applications: [{ name, principalId, principalType }] (principalId may be empty: no grant).')
param submittingApps submittingApp[]
@description('Inbound queue ("<name>-orders") of each submitting application, index-aligned with submittingApps.')
param inboundQueueNames array
@description('Status queue of each submitting application, index-aligned with submittingApps.')
param statusQueueNames array
@description('The legacy app (main.bicep legacyOrdersApp, checked there to be one of submittingApps): the only one that may send to orders-inbound; empty for none.')
param legacyOrdersApp string = ''
@description('Whether the legacy app may still send to orders-inbound (false once it has moved to its own queue).')
param legacyOrdersQueueOpen bool = true
@description('Optional principal (a group, typically): the operator CLI\'s rights (header); empty for none.')
param operatorPrincipalId string = ''
@allowed([
  'Group'
  'User'
  'ServicePrincipal'
])
param operatorPrincipalType string = 'Group'

param serviceBusNamespaceName string
param ordersQueueName string
param agentRequestsQueueName string
param agentRepliesQueueName string
param operatorAlertsQueueName string
param storageAccountName string
@allowed([
  'AzureStorage'
  'DurableTaskScheduler'
])
@description('Durable backend: the storage queue and table roles are granted for AzureStorage only.')
param durableBackend string = 'AzureStorage'
param applicationInsightsName string
param cosmosAccountName string
param ordersDatabaseName string
@description('Container of the stored orders (in the orders database): operators may set its items\' ttl (orderflow keep).')
param ordersContainerName string = 'orders'
param stateDatabaseName string
@description('Container of the circuit-breaker documents (in the state database): the Agent\'s only Cosmos DB scope.')
param circuitBreakerContainerName string
param registryName string

// Built-in role definition ids (https://learn.microsoft.com/azure/role-based-access-control/built-in-roles).
var roles = {
  serviceBusDataReceiver: '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'
  serviceBusDataSender: '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'
  storageBlobDataOwner: 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
  storageQueueDataContributor: '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
  storageTableDataContributor: '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
  monitoringMetricsPublisher: '3913510d-42f4-4e42-8a64-420c390055eb'
  acrPull: '7f951dda-4ed3-4680-a7ca-43fe172d538d'
  reader: 'acdd72a7-3385-48ef-bd42-f606fba81ae7'
}
// Cosmos DB data-plane built-in role (sqlRoleDefinitions): Cosmos DB Built-in Data Contributor.
var cosmosDataContributor = '00000000-0000-0000-0000-000000000002'
// Cosmos DB Built-in Data Reader: the operators' read of the orders database.
var cosmosDataReader = '00000000-0000-0000-0000-000000000001'
// The Agent's custom Cosmos DB data-plane role: exactly the data actions the circuit breaker uses (orderflow/azure/
// cosmos.py: read_item, create_item, If-Match replace_item). Names as in "Azure Cosmos DB for NoSQL data plane
// actions reference" (https://learn.microsoft.com/azure/cosmos-db/nosql/security/reference-data-plane-actions):
// readMetadata (account metadata every SDK client reads), items/read (point read), items/create, items/replace.
// Left out on purpose: items/delete, items/upsert, containers/executeQuery, containers/readChangeFeed, and any `*`.
// (Cosmos DB's native RBAC has no notDataActions: what is not listed is denied.)
var circuitBreakerDataActions = [
  'Microsoft.DocumentDB/databaseAccounts/readMetadata'
  'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers/items/read'
  'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers/items/create'
  'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers/items/replace'
]
var useAzureStorageDurableBackend = durableBackend == 'AzureStorage'

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: serviceBusNamespaceName

  resource ordersQueue 'queues' existing = {
    name: ordersQueueName
  }
  resource agentRequestsQueue 'queues' existing = {
    name: agentRequestsQueueName
  }
  resource agentRepliesQueue 'queues' existing = {
    name: agentRepliesQueueName
  }
  resource operatorAlertsQueue 'queues' existing = {
    name: operatorAlertsQueueName
  }
}

resource inboundQueues 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' existing = [for name in inboundQueueNames: {
  parent: namespace
  name: name
}]

resource statusQueues 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' existing = [for name in statusQueueNames: {
  parent: namespace
  name: name
}]

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

resource cosmosAccount 'Microsoft.DocumentDB/databaseAccounts@2024-05-15' existing = {
  name: cosmosAccountName
}

resource registry 'Microsoft.ContainerRegistry/registries@2023-07-01' existing = {
  name: registryName
}

// ---- function app: Service Bus ----
// orders-inbound is read only while there is a legacy app (the trigger `submission` exists only then).
resource appReceivesOrders 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(legacyOrdersApp)) {
  name: guid(namespace::ordersQueue.id, appPrincipalId, roles.serviceBusDataReceiver)
  scope: namespace::ordersQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataReceiver)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appReceivesInbound 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in inboundQueueNames: {
  name: guid(inboundQueues[i].id, appPrincipalId, roles.serviceBusDataReceiver)
  scope: inboundQueues[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataReceiver)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}]

resource appSendsAgentRequests 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(namespace::agentRequestsQueue.id, appPrincipalId, roles.serviceBusDataSender)
  scope: namespace::agentRequestsQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appReceivesAgentReplies 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(namespace::agentRepliesQueue.id, appPrincipalId, roles.serviceBusDataReceiver)
  scope: namespace::agentRepliesQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataReceiver)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appSendsOperatorAlerts 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(namespace::operatorAlertsQueue.id, appPrincipalId, roles.serviceBusDataSender)
  scope: namespace::operatorAlertsQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appSendsStatus 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in statusQueueNames: {
  name: guid(statusQueues[i].id, appPrincipalId, roles.serviceBusDataSender)
  scope: statusQueues[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}]

// ---- function app: Reader on each queue the ops summary reads (its runtime counts, no message, no key) ----
resource appReadsOrdersCounts 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(namespace::ordersQueue.id, appPrincipalId, roles.reader)
  scope: namespace::ordersQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.reader)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appReadsAgentRequestsCounts 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(namespace::agentRequestsQueue.id, appPrincipalId, roles.reader)
  scope: namespace::agentRequestsQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.reader)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appReadsAgentRepliesCounts 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(namespace::agentRepliesQueue.id, appPrincipalId, roles.reader)
  scope: namespace::agentRepliesQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.reader)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appReadsOperatorAlertsCounts 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(namespace::operatorAlertsQueue.id, appPrincipalId, roles.reader)
  scope: namespace::operatorAlertsQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.reader)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appReadsInboundCounts 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in inboundQueueNames: {
  name: guid(inboundQueues[i].id, appPrincipalId, roles.reader)
  scope: inboundQueues[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.reader)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}]

resource appReadsStatusCounts 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in statusQueueNames: {
  name: guid(statusQueues[i].id, appPrincipalId, roles.reader)
  scope: statusQueues[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.reader)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}]

// ---- function app: host storage (Blob: AzureWebJobsStorage and the Flex deployment package, either backend) and
// the Durable task hub's queues and tables (Azure Storage backend only: the Durable Task Scheduler keeps the task
// hub in the scheduler, so that backend needs neither role) ----
resource appOwnsBlobs 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, appPrincipalId, roles.storageBlobDataOwner)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataOwner)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appUsesQueues 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (useAzureStorageDurableBackend) {
  name: guid(storage.id, appPrincipalId, roles.storageQueueDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageQueueDataContributor)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appUsesTables 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (useAzureStorageDurableBackend) {
  name: guid(storage.id, appPrincipalId, roles.storageTableDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageTableDataContributor)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// ---- function app: telemetry (Application Insights with local auth disabled) ----
resource appPublishesTelemetry 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(applicationInsights.id, appPrincipalId, roles.monitoringMetricsPublisher)
  scope: applicationInsights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.monitoringMetricsPublisher)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// ---- function app: Cosmos DB data plane, one grant per database ----
resource appOrdersData 'Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2024-05-15' = {
  parent: cosmosAccount
  name: guid(cosmosAccount.id, appPrincipalId, cosmosDataContributor, ordersDatabaseName)
  properties: {
    roleDefinitionId: '${cosmosAccount.id}/sqlRoleDefinitions/${cosmosDataContributor}'
    principalId: appPrincipalId
    scope: '${cosmosAccount.id}/dbs/${ordersDatabaseName}'
  }
}

// Serialised after appOrdersData: concurrent sqlRoleAssignments writes on one account fail with 412 "another
// operation is in progress" (docs/deploy.md, "Deployment fixes"). A further grant on this account depends on this one.
resource appStateData 'Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2024-05-15' = {
  parent: cosmosAccount
  name: guid(cosmosAccount.id, appPrincipalId, cosmosDataContributor, stateDatabaseName)
  dependsOn: [
    appOrdersData
  ]
  properties: {
    roleDefinitionId: '${cosmosAccount.id}/sqlRoleDefinitions/${cosmosDataContributor}'
    principalId: appPrincipalId
    scope: '${cosmosAccount.id}/dbs/${stateDatabaseName}'
  }
}

// ---- Agent: the circuit-breaker container only (Cosmos DB data plane, custom role) ----
// A data-plane scope is a path under the account: /dbs/<database>/colls/<container>. The definition may only be
// assigned there (assignableScopes), and the one assignment is there. Role definitions and assignments on one account
// are written one at a time (the 412 above): the definition follows appStateData, the assignment follows the
// definition (it references its id).
resource circuitBreakerRole 'Microsoft.DocumentDB/databaseAccounts/sqlRoleDefinitions@2024-05-15' = {
  parent: cosmosAccount
  name: guid(cosmosAccount.id, stateDatabaseName, circuitBreakerContainerName, 'orderflow-circuit-breaker')
  dependsOn: [
    appStateData
  ]
  properties: {
    roleName: 'orderflow circuit breaker (${stateDatabaseName}/${circuitBreakerContainerName}): read, create, replace items'
    type: 'CustomRole'
    assignableScopes: [
      '${cosmosAccount.id}/dbs/${stateDatabaseName}/colls/${circuitBreakerContainerName}'
    ]
    permissions: [
      {
        dataActions: circuitBreakerDataActions
      }
    ]
  }
}

resource agentCircuitBreakerData 'Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2024-05-15' = {
  parent: cosmosAccount
  name: guid(cosmosAccount.id, agentPrincipalId, circuitBreakerRole.id, circuitBreakerContainerName)
  properties: {
    roleDefinitionId: circuitBreakerRole.id
    principalId: agentPrincipalId
    scope: '${cosmosAccount.id}/dbs/${stateDatabaseName}/colls/${circuitBreakerContainerName}'
  }
}

// ---- Agent: Service Bus, telemetry, image ----
resource agentReceivesRequests 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(namespace::agentRequestsQueue.id, agentPrincipalId, roles.serviceBusDataReceiver)
  scope: namespace::agentRequestsQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataReceiver)
    principalId: agentPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource agentSendsReplies 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(namespace::agentRepliesQueue.id, agentPrincipalId, roles.serviceBusDataSender)
  scope: namespace::agentRepliesQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
    principalId: agentPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource agentSendsOperatorAlerts 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(namespace::operatorAlertsQueue.id, agentPrincipalId, roles.serviceBusDataSender)
  scope: namespace::operatorAlertsQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
    principalId: agentPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// Telemetry (Application Insights with local auth disabled): ingestion with the Agent's own Entra ID token.
resource agentPublishesTelemetry 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(applicationInsights.id, agentPrincipalId, roles.monitoringMetricsPublisher)
  scope: applicationInsights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.monitoringMetricsPublisher)
    principalId: agentPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource agentPullsImage 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(registry.id, agentPrincipalId, roles.acrPull)
  scope: registry
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.acrPull)
    principalId: agentPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// ---- submitting applications: each its own inbound queue and status queue, the legacy app orders-inbound too ----
resource submitterSendsOwnOrders 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (app, i) in submittingApps: if (!empty(app.principalId)) {
  name: guid(inboundQueues[i].id, app.principalId, roles.serviceBusDataSender)
  scope: inboundQueues[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
    principalId: app.principalId
    principalType: app.?principalType ?? 'ServicePrincipal'
  }
}]

// The same name as the grant every app had before issue 25: the legacy app's stays as it is.
resource legacyAppSendsOrders 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for app in submittingApps: if (!empty(app.principalId) && legacyOrdersQueueOpen && (app.name == legacyOrdersApp)) {
  name: guid(namespace::ordersQueue.id, app.principalId, roles.serviceBusDataSender)
  scope: namespace::ordersQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
    principalId: app.principalId
    principalType: app.?principalType ?? 'ServicePrincipal'
  }
}]

resource submitterReceivesOwnStatus 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (app, i) in submittingApps: if (!empty(app.principalId)) {
  name: guid(statusQueues[i].id, app.principalId, roles.serviceBusDataReceiver)
  scope: statusQueues[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataReceiver)
    principalId: app.principalId
    principalType: app.?principalType ?? 'ServicePrincipal'
  }
}]

// ---- operators (optional): the operator CLI's rights, see the header ----
resource operatorsReceive 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(operatorPrincipalId)) {
  name: guid(namespace.id, operatorPrincipalId, roles.serviceBusDataReceiver)
  scope: namespace
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataReceiver)
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
  }
}

resource operatorsSend 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(operatorPrincipalId)) {
  name: guid(namespace.id, operatorPrincipalId, roles.serviceBusDataSender)
  scope: namespace
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
  }
}

// One Cosmos DB grant at a time on the account (the 412 above): after the Agent's, then one after the other.
resource operatorsReadOrders 'Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2024-05-15' = if (!empty(operatorPrincipalId)) {
  parent: cosmosAccount
  name: guid(cosmosAccount.id, operatorPrincipalId, cosmosDataReader, ordersDatabaseName)
  dependsOn: [
    agentCircuitBreakerData
  ]
  properties: {
    roleDefinitionId: '${cosmosAccount.id}/sqlRoleDefinitions/${cosmosDataReader}'
    principalId: operatorPrincipalId
    scope: '${cosmosAccount.id}/dbs/${ordersDatabaseName}'
  }
}

resource operatorsStateData 'Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2024-05-15' = if (!empty(operatorPrincipalId)) {
  parent: cosmosAccount
  name: guid(cosmosAccount.id, operatorPrincipalId, cosmosDataContributor, stateDatabaseName)
  dependsOn: [
    operatorsReadOrders
  ]
  properties: {
    roleDefinitionId: '${cosmosAccount.id}/sqlRoleDefinitions/${cosmosDataContributor}'
    principalId: operatorPrincipalId
    scope: '${cosmosAccount.id}/dbs/${stateDatabaseName}'
  }
}

// `orderflow keep` gives the stored order ttl -1 (docs/retention.md): a point read and an If-Match replace, nothing
// else; the orders stay immutable to operators in content only by the CLI's use of this right.
var keepOrderDataActions = [
  'Microsoft.DocumentDB/databaseAccounts/readMetadata'
  'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers/items/read'
  'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers/items/replace'
]

resource keepOrderRole 'Microsoft.DocumentDB/databaseAccounts/sqlRoleDefinitions@2024-05-15' = if (!empty(operatorPrincipalId)) {
  parent: cosmosAccount
  name: guid(cosmosAccount.id, ordersDatabaseName, ordersContainerName, 'orderflow-keep-order')
  dependsOn: [
    operatorsStateData
  ]
  properties: {
    roleName: 'orderflow keep (${ordersDatabaseName}/${ordersContainerName}): read, replace items'
    type: 'CustomRole'
    assignableScopes: [
      '${cosmosAccount.id}/dbs/${ordersDatabaseName}/colls/${ordersContainerName}'
    ]
    permissions: [
      {
        dataActions: keepOrderDataActions
      }
    ]
  }
}

resource operatorsKeepOrders 'Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2024-05-15' = if (!empty(operatorPrincipalId)) {
  parent: cosmosAccount
  name: guid(cosmosAccount.id, operatorPrincipalId, 'orderflow-keep-order', ordersContainerName)
  properties: {
    roleDefinitionId: keepOrderRole.id
    principalId: operatorPrincipalId
    scope: '${cosmosAccount.id}/dbs/${ordersDatabaseName}/colls/${ordersContainerName}'
  }
}
