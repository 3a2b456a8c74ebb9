// Concern: the Service Bus namespace and its queues, configured as the Scheduler Agent Supervisor pattern needs.
// Standard tier (sessions and duplicate detection need it), Entra ID only (disableLocalAuth), TLS 1.2. The private
// posture (vnetEnabled) raises it to Premium, the only tier with private endpoints (docs/deploy.md, "Production posture").
// requiresSession and requiresDuplicateDetection cannot be changed on an existing queue: changing them here means
// deleting and recreating the queue.
param location string
param tags object = {}
param namespaceName string
@description('The shared inbound queue of before per-app queues: only the legacy app (main.bicep legacyOrdersApp) sends there.')
param ordersQueueName string
param agentRequestsQueueName string
param agentRepliesQueueName string
param operatorAlertsQueueName string
@description('One inbound queue per submitting application ("<name>-orders"), index-aligned with statusQueueNames.')
param inboundQueueNames array
@description('One status (reply) queue per submitting application ("<name>-status").')
param statusQueueNames array
param logAnalyticsWorkspaceId string
@description('Private posture (main.bicep vnetEnabled): Premium tier, no public network access, a private endpoint.')
param vnetEnabled bool = false
@description('Messaging units of the Premium namespace (private posture only): 1, 2, 4, 8 or 16.')
@allowed([
  1
  2
  4
  8
  16
])
param premiumMessagingUnits int = 1

// Private endpoints exist on Premium only; Standard is billed per operation, Premium per messaging unit and hour.
var skuName = vnetEnabled ? 'Premium' : 'Standard'

// Queue properties: the same values as servicebus.config.json, which the embedded broker runs locally (a test keeps
// the two equal). Common to every queue: a 10-minute duplicate-detection window on MessageId, and a 1-minute peek lock
// (the host and the Agent renew it while they work) except on the Agent queues (below).
var lockDuration = 'PT1M'
// The Agent queues lock for 5 s, the Service Bus minimum: a consumer that dies holding an order's session (SessionId
// = orderId) blocks that order's requests or replies only until its lock expires, and 5 s + 5 s stay well inside
// one step (StepTimeoutSeconds), so a crash never costs the order an attempt (orderflow/session_locks.py; checked by
// tests/product/infra/test_crash_budget.py). Live consumers renew every 2.5 s.
var agentLockDuration = 'PT5S'
var duplicateDetectionWindow = 'PT10M'

// The pattern's queues carry one order per session (SessionId = orderId: FIFO per order, Sequential Convoy) and a
// stable MessageId (duplicate detection drops a retried send). A message that fails 5 deliveries is poison and is
// dead-lettered; one that expires is dead-lettered too, never silently dropped.
var patternQueue = {
  requiresSession: true
  requiresDuplicateDetection: true
  duplicateDetectionHistoryTimeWindow: duplicateDetectionWindow
  lockDuration: lockDuration
  maxDeliveryCount: 5
  deadLetteringOnMessageExpiration: true
  enableBatchedOperations: true
  enablePartitioning: false
}
// Orders wait up to 14 days (an outage of the app must not lose them); requests and replies are stale after a day
// (each step's CompleteBy is minutes; the Supervisor recovers the order). Every app's own inbound queue has exactly
// the properties of orders-inbound: an order is the same message whichever of them it arrives on.
var ordersQueueProperties = union(patternQueue, { defaultMessageTimeToLive: 'P14D' })
var agentQueueProperties = union(patternQueue, { defaultMessageTimeToLive: 'P1D', lockDuration: agentLockDuration })

// Operator alerts: not per order (no sessions); kept 14 days; dead-lettered on expiry so an unread alert stays.
var operatorAlertsQueueProperties = {
  requiresSession: false
  requiresDuplicateDetection: false
  lockDuration: lockDuration
  maxDeliveryCount: 10
  defaultMessageTimeToLive: 'P14D'
  deadLetteringOnMessageExpiration: true
  enableBatchedOperations: true
  enablePartitioning: false
}

// Status messages to a submitting application: SessionId = orderId and a stable MessageId, like the pattern queues;
// a status nobody read within a day is dropped (the order's state stays in the state store).
var statusQueueProperties = {
  requiresSession: true
  requiresDuplicateDetection: true
  duplicateDetectionHistoryTimeWindow: duplicateDetectionWindow
  lockDuration: lockDuration
  maxDeliveryCount: 10
  defaultMessageTimeToLive: 'P1D'
  deadLetteringOnMessageExpiration: false
  enableBatchedOperations: true
  enablePartitioning: false
}

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' = {
  name: namespaceName
  location: location
  tags: tags
  sku: {
    name: skuName
    tier: skuName
    // Messaging units exist on Premium only (null, as if absent, on Standard).
    capacity: vnetEnabled ? premiumMessagingUnits : null
  }
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: vnetEnabled ? 'Disabled' : 'Enabled'
  }

  resource ordersQueue 'queues' = {
    name: ordersQueueName
    properties: ordersQueueProperties
  }

  resource agentRequestsQueue 'queues' = {
    name: agentRequestsQueueName
    properties: agentQueueProperties
  }

  resource agentRepliesQueue 'queues' = {
    name: agentRepliesQueueName
    properties: agentQueueProperties
  }

  resource operatorAlertsQueue 'queues' = {
    name: operatorAlertsQueueName
    properties: operatorAlertsQueueProperties
  }

  // Each submitting app's own inbound queue: only its identity may send there (rbac.bicep), so the queue an order
  // arrives on names its app (orderflow/apps.py); the function app reads each one (trigger submission-<name>).
  resource inboundQueues 'queues' = [for name in inboundQueueNames: {
    name: name
    properties: ordersQueueProperties
  }]

  resource statusQueues 'queues' = [for name in statusQueueNames: {
    name: name
    properties: statusQueueProperties
  }]
}

resource diagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: namespace
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    logs: [
      {
        categoryGroup: 'allLogs'
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

output namespaceId string = namespace.id
output namespaceName string = namespace.name
// serviceBusEndpoint is 'https://<name>.servicebus.windows.net:443/' (the cloud's own suffix): keep the host only.
output fullyQualifiedNamespace string = split(replace(namespace.properties.serviceBusEndpoint, 'https://', ''), ':')[0]
