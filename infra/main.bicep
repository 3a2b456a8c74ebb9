// orderflow on Azure: the Scheduler Agent Supervisor order pipeline (azd entry point, subscription scope).
// One module per concern under app/: identity, monitoring, storage, servicebus, cosmos, registry, function, agent,
// durable-task-scheduler (optional backend), rbac (every data-plane grant), alerts, workbook (operations). Identity
// only: no key, SAS or secret-bearing connection string is created, read or output anywhere. Every resource name is
// overridable.
targetScope = 'subscription'

// Types of the array parameters (app/types.bicep): a malformed entry fails at compile time, not at deploy time.
import { submittingApp, alwaysReadyEntry } from 'app/types.bicep'

@minLength(1)
@maxLength(64)
@description('azd environment name: part of every generated resource name.')
param environmentName string

@minLength(1)
@description('Region of every resource (must offer Flex Consumption).')
param location string

// ---------- names (empty: generated from abbreviations.json and a token) ----------
param resourceGroupName string = ''
param appIdentityName string = ''
param agentIdentityName string = ''
param logAnalyticsName string = ''
param applicationInsightsName string = ''
param storageAccountName string = ''
param serviceBusNamespaceName string = ''
param cosmosAccountName string = ''
param registryName string = ''
param functionPlanName string = ''
param functionAppName string = ''
param containerAppsEnvironmentName string = ''
param agentContainerAppName string = ''
param simulatorContainerAppName string = ''
param simulatorIdentityName string = ''
param durableTaskSchedulerName string = ''
param virtualNetworkName string = ''
@description('Operations workbook (app/workbook.bicep); empty: a GUID from the resource group (it must be a GUID).')
param workbookName string = ''

// ---------- the pattern's queues, databases and containers (defaults = orderflow/settings.py) ----------
param ordersQueueName string = 'orders-inbound'
param agentRequestsQueueName string = 'agent-requests'
param agentRepliesQueueName string = 'agent-replies'
param operatorAlertsQueueName string = 'operator-alerts'
param ordersDatabaseName string = 'orders'
param ordersContainerName string = 'orders'
param stateDatabaseName string = 'state'
param stateContainerName string = 'orderState'
param checkpointContainerName string = 'supervisorCheckpoints'
@description('Container (state database, partition key /id) of the circuit-breaker documents; the Agent\'s only Cosmos DB scope.')
param circuitBreakerContainerName string = 'circuitBreakers'
@description('Container (state database, partition key /bucket, entries expire after 7 days) of the Supervisor\'s recovery index (SupervisorScanMode=index).')
param recoveryIndexContainerName string = 'recoveryIndex'

@description('''Submitting applications (app setting SubmittingApps). Each gets its own inbound queue "<name>-orders" and
status queue "<name>-status"; its principal (when not empty) may send to its own inbound queue and receive from its own
status queue, nothing else (the legacy app may also send to orders-inbound: legacyOrdersApp).
principalType: ServicePrincipal (default), User or Group; main.parameters.json passes azd's AZURE_PRINCIPAL_TYPE
(User or ServicePrincipal, whichever is logged in), so a CI service principal deploys as well as a user.''')
@minLength(1)
param submittingApps submittingApp[] = [
  {
    name: 'app'
    principalId: ''
    principalType: 'ServicePrincipal'
  }
]

@description('''The legacy app (app setting LegacyOrdersApp): the app that owned every order when all apps sent to the one
orders-inbound queue. It alone may still send there, and its order ids stay unscoped, so its existing orders keep
matching (docs/deploy.md, "Move an app to its own queue"). Default: the first submitting app. '' or 'none': no legacy
app; orders-inbound stays (nobody may send to it, the function app does not read it). Any other value must name one of
submittingApps, or the deployment fails.''')
param legacyOrdersApp string = submittingApps[0].name
@description('''Whether the legacy app may still send to orders-inbound (default true). False once it sends to its own
queue and orders-inbound is drained: nobody may send there any more, while LegacyOrdersApp keeps its order ids unscoped
and the function app still reads what is left (docs/deploy.md, "Move an app to its own queue"). Bicep does not delete
the former assignment: the postprovision hook then reports it (and deletes it with ORDERFLOW_PRUNE_SHARED_QUEUE_SENDERS).''')
param legacyOrdersQueueOpen bool = true
@description('App setting MaxPendingOrdersPerApp: per-app backlog bounds, e.g. \'app=5000,partner=200\'; an app not named gets MaxPendingOrders.')
param maxPendingOrdersPerApp string = ''

@description('Optional principal (an operators group): the operator CLI\'s rights (rbac.bicep: every queue, the stores).')
param operatorPrincipalId string = ''
@allowed([
  'Group'
  'User'
  'ServicePrincipal'
])
param operatorPrincipalType string = 'Group'

// ---------- operator sign-in: App Service authentication with Microsoft Entra ID (app/function.bicep) ----------
@description('''Client (application) id of the operator API's Entra ID app registration; azd's preprovision hook
(infra/hooks/preprovision.sh, .ps1) creates it with the app role operatorAppRole and sets AUTH_CLIENT_ID. Required:
an empty value fails the deployment, since the operator routes would otherwise take requests without sign-in.''')
param authClientId string = ''
@description('Tenant of that app registration: only tokens it issues are accepted. Default: the subscription\'s.')
param authTenantId string = subscription().tenantId
@description('The app role (its value) an operator\'s token must carry: app setting OperatorAppRole; the hook declares it.')
param operatorAppRole string = 'Orders.Operator'

// ---------- Durable Functions backend ----------
@allowed([
  'AzureStorage'
  'DurableTaskScheduler'
])
@description('AzureStorage (default; what func start + Azurite mirrors) or DurableTaskScheduler.')
param durableBackend string = 'AzureStorage'
param taskHubName string = 'orderflow'
@allowed([
  'Consumption'
  'Dedicated'
])
param durableTaskSchedulerSku string = 'Consumption'

// ---------- Cosmos DB capacity ----------
@allowed([
  'serverless'
  'autoscale'
])
param cosmosCapacityMode string = 'serverless'
@minValue(1000)
param cosmosAutoscaleMaxThroughput int = 1000
@description('''Continuous backup tier of the Cosmos DB account (azd env ORDERFLOW_COSMOS_BACKUP_TIER): the point-in-time
restore window, 7 days (no backup storage charge) or 30 days (charged per GB and region). See docs/deploy.md, "Retention
and backup".''')
@allowed([
  'Continuous7Days'
  'Continuous30Days'
])
param cosmosBackupTier string = 'Continuous7Days'

// ---------- retention: data that ends (issue 26; docs/deploy.md, "Retention and backup") ----------
@description('''App setting FinishedOrderRetentionSeconds (default 90 days): the Cosmos DB TTL a finished order's state
record and stored order get once its terminal status went out; 0 keeps finished orders forever.''')
@minValue(0)
param finishedOrderRetentionSeconds int = 7776000
@description('''App setting InstanceRetentionSeconds (default 30 days): the purge timer deletes finished Durable instances
created longer ago; 0 never purges. With durableBackend=DurableTaskScheduler it also sets the scheduler's retention
policy (whole days, rounded up; the scheduler keeps 90 days at most).''')
@minValue(0)
param instanceRetentionSeconds int = 2592000

// ---------- function app scale ----------
@minValue(40)
@maxValue(1000)
param functionMaximumInstanceCount int = 100
@allowed([
  512
  2048
  4096
])
param functionInstanceMemoryMB int = 2048
@description('Always-ready instances, e.g. [{ name: \'durable\', instanceCount: 1 }, { name: \'function:supervisor\', instanceCount: 1 }].')
param functionAlwaysReady alwaysReadyEntry[] = []
@description('''Tunables to change from their defaults, e.g. { StepTimeoutSeconds: '45' } (names as in orderflow/settings.py).
The Agent takes RemoteServiceName and the CircuitBreaker* values from here too, so both read the breaker alike.''')
param appSettingOverrides object = {}

// ---------- the Agent ----------
@description('''Base URL of the remote service the Agent calls (azd env AGENT_REMOTE_URL). Empty (default): the
remote-service simulator (app/simulator.bicep) is deployed beside the Agent and the Agent calls it.''')
param agentRemoteUrl string = ''
@description('azd: SERVICE_AGENT_RESOURCE_EXISTS. True once the Agent\'s container app exists: it keeps its image.')
param agentExists bool = false
@description('azd: SERVICE_SIMULATOR_RESOURCE_EXISTS. True once the simulator\'s container app exists: it keeps its image.')
param simulatorExists bool = false
@description('Agent replicas, always running: fixed, no scale rule (docs/deploy.md, "Agent telemetry and scaling").')
@minValue(1)
param agentReplicas int = 2

// ---------- network posture ----------
@description('''Private posture (azd env VNET_ENABLED): a VNet (app/network.bicep) with the function app's integration
subnet, the Agent's Container Apps environment subnet and a private-endpoint subnet; private endpoints and privatelink
DNS zones for Storage (blob, queue, table), Service Bus and Cosmos DB, whose public network access is disabled;
Service Bus becomes Premium (the only tier with private endpoints). The function app's HTTP routes are reachable through
its own private endpoint only. The Durable Task Scheduler stays public (identity only). Off (default): nothing of this
is deployed. Set it before the first `azd up` of an environment: neither the Service Bus tier nor a Container Apps
environment's network changes in place. See docs/deploy.md, "Production posture".''')
param vnetEnabled bool = false
@description('''With vnetEnabled: keep the function app's deployment (SCM) endpoint public, Entra ID only, so `azd deploy`
works from outside the VNet (default). False: the site's publicNetworkAccess is Disabled, SCM included: deploy from a
machine in the VNet.''')
param functionPublicDeployment bool = true

// ---------- alerts ----------
@description('E-mail address for operator alerts; empty for none.')
param alertEmail string = ''
@minValue(5)
param supervisorSilenceMinutes int = 15
@description('''Dead letters on a sender's queue (orders-inbound, an app's inbound or status queue) above which the Sev-3
alert fires, and the app's dead-letters alarm with it (app setting SenderDeadLetterAlarmDepth: one value for both); also
the bad-input alert's count of poison or conflicting messages per 15 minutes.''')
@minValue(1)
param badInputThreshold int = 20

// ---------- operations workbook ----------
@description('Display name of the operations workbook (the figures of `orderflow summary`) in the Workbooks gallery.')
param workbookDisplayName string = 'orderflow operations (${environmentName})'

var abbrs = loadJsonContent('abbreviations.json')
var resourceToken = toLower(uniqueString(subscription().id, environmentName, location))
var tags = {
  'azd-env-name': environmentName
}
var submittingAppNames = [for app in submittingApps: app.name]
var inboundQueueNames = [for app in submittingApps: '${app.name}-orders']
var statusQueueNames = [for app in submittingApps: '${app.name}-status']
// The legacy app's name, '' for none; a name that is not a submitting app's fails the deployment (before any change).
var hasLegacyApp = !(empty(legacyOrdersApp) || legacyOrdersApp == 'none')
var legacyApp = !hasLegacyApp
  ? ''
  : (contains(submittingAppNames, legacyOrdersApp)
      ? legacyOrdersApp
      : fail('legacyOrdersApp \'${legacyOrdersApp}\' is not one of submittingApps (${join(submittingAppNames, ', ')}); use \'none\' for no legacy app.'))
// Operator sign-in is not optional: without an app registration the operator routes would take anonymous requests.
var operatorAuthClientId = !empty(authClientId)
  ? authClientId
  : fail('authClientId is empty: the operator API needs an Entra ID app registration. azd: the preprovision hook (infra/hooks) sets AUTH_CLIENT_ID; without azd, pass authClientId=<application (client) id> (docs/deploy.md, "Operator sign-in").')
// ---------- submittingApps as the code accepts them (orderflow/apps.py), checked before anything is deployed ----------
// The function app refuses to start (the worker indexes no function at all) on an app name outside APP_NAME_PATTERN,
// ^[a-z][a-z0-9-]{0,23}$, on 'none' (LegacyOrdersApp's "no legacy app") and on a name given twice; and one principal
// for two apps would merge two tenants (one identity sending to both inbound queues and reading both status queues,
// so the queue no longer tells their orders apart). Each check below is true or Bicep's fail(): ARM evaluates every
// variable when it validates the template, before any resource is deployed, so nothing needs to refer to them.
// Bicep has no regex: a valid name is 1-24 characters, lower case (toLower changes nothing), starts with a letter
// (contains() compares case-sensitively) and leaves nothing once every allowed character is replaced by ''.
// tests/product/infra/test_submitting_app_checks.py evaluates these against the code's own rule.
var appNameLetters = 'abcdefghijklmnopqrstuvwxyz'
var appNameAlphabet = '${appNameLetters}0123456789-'
var appNameCharacters = [for i in range(0, length(appNameAlphabet)): substring(appNameAlphabet, i, 1)]
// Per app: '' for a name the code accepts, the name in quotes for one it refuses.
var appNameVerdicts = [for name in submittingAppNames: length(name) >= 1 && length(name) <= 24 && name != 'none' && name == toLower(name) && contains(appNameLetters, take(name, 1)) && empty(reduce(appNameCharacters, name, (rest, c) => replace(rest, c, ''))) ? '' : '\'${name}\'']
var invalidAppNames = filter(appNameVerdicts, verdict => !empty(verdict))
// Per app: the name in quotes when an app before it has the same name, '' otherwise.
var appNameRepeats = [for (name, i) in submittingAppNames: contains(take(submittingAppNames, i), name) ? '\'${name}\'' : '']
var repeatedAppNames = filter(appNameRepeats, repeat => !empty(repeat))
// Object ids are GUIDs, compared lower-cased. Per app: the app and its principalId when it is not empty and an app
// before it has the same one, '' otherwise.
var submitterPrincipalIds = [for app in submittingApps: toLower(app.principalId)]
var principalRepeats = [for (app, i) in submittingApps: !empty(app.principalId) && contains(take(submitterPrincipalIds, i), toLower(app.principalId)) ? '\'${app.name}\' (${app.principalId})' : '']
var sharedPrincipalApps = filter(principalRepeats, repeat => !empty(repeat))
#disable-next-line no-unused-vars
var appNamesAccepted = empty(invalidAppNames)
  ? true
  : fail('submittingApps: the function app refuses the app name(s) ${join(invalidAppNames, ', ')} (orderflow/apps.py): a name is 1-24 characters of a-z, 0-9 and -, starts with a letter, and is not \'none\'.')
#disable-next-line no-unused-vars
var appNamesDistinct = empty(repeatedAppNames)
  ? true
  : fail('submittingApps names an app more than once: ${join(repeatedAppNames, ', ')}; the function app refuses that.')
#disable-next-line no-unused-vars
var appPrincipalsDistinct = empty(sharedPrincipalApps)
  ? true
  : fail('submittingApps: ${join(sharedPrincipalApps, ', ')} has the principalId of an app listed before it. One identity for two apps would send to both inbound queues and read both status queues, so their orders could no longer be told apart: give each app its own identity (or \'\' for no grant).')
// The legacy app's principal while it may send to orders-inbound ('' otherwise): the postprovision hook keeps its
// Data Sender there and reports every other sender (infra/hooks/postprovision.sh).
var legacyAppPrincipalIds = [for app in submittingApps: app.name == legacyApp ? app.principalId : '']
var legacyOrdersSenderPrincipalId = hasLegacyApp && legacyOrdersQueueOpen ? join(legacyAppPrincipalIds, '') : ''

// The settings that have their own parameter because infra/ uses the value twice (InstanceRetentionSeconds: the
// scheduler's retention policy; SenderDeadLetterAlarmDepth: the sender dead-letter alert) or documents it as one
// (FinishedOrderRetentionSeconds). appSettingOverrides would change only the app's copy, so it may not name them.
var settingsWithParameters = {
  FinishedOrderRetentionSeconds: 'finishedOrderRetentionSeconds'
  InstanceRetentionSeconds: 'instanceRetentionSeconds'
  SenderDeadLetterAlarmDepth: 'badInputThreshold'
}
var overriddenSettingParameters = filter(items(settingsWithParameters), setting => contains(appSettingOverrides, setting.key))
#disable-next-line no-unused-vars
var settingParametersNotOverridden = empty(overriddenSettingParameters)
  ? true
  : fail('appSettingOverrides sets ${join(map(overriddenSettingParameters, setting => '${setting.key} (use the parameter ${setting.value})'), ', ')}: these settings have their own parameters, which also configure the alerts or the Durable Task Scheduler.')

var useDurableTaskScheduler = durableBackend == 'DurableTaskScheduler'
var useSimulator = empty(agentRemoteUrl)
var simulatorAppName = !empty(simulatorContainerAppName) ? simulatorContainerAppName : '${abbrs.appContainerApps}simulator-${resourceToken}'

resource rg 'Microsoft.Resources/resourceGroups@2024-03-01' = {
  name: !empty(resourceGroupName) ? resourceGroupName : '${abbrs.resourcesResourceGroups}${environmentName}'
  location: location
  tags: tags
}

module identity 'app/identity.bicep' = {
  name: 'identity'
  scope: rg
  params: {
    location: location
    tags: tags
    appIdentityName: !empty(appIdentityName) ? appIdentityName : '${abbrs.managedIdentityUserAssignedIdentities}func-${resourceToken}'
    agentIdentityName: !empty(agentIdentityName) ? agentIdentityName : '${abbrs.managedIdentityUserAssignedIdentities}agent-${resourceToken}'
  }
}

module monitoring 'app/monitoring.bicep' = {
  name: 'monitoring'
  scope: rg
  params: {
    location: location
    tags: tags
    logAnalyticsName: !empty(logAnalyticsName) ? logAnalyticsName : '${abbrs.operationalInsightsWorkspaces}${resourceToken}'
    applicationInsightsName: !empty(applicationInsightsName) ? applicationInsightsName : '${abbrs.insightsComponents}${resourceToken}'
  }
}

module storage 'app/storage.bicep' = {
  name: 'storage'
  scope: rg
  params: {
    location: location
    tags: tags
    storageAccountName: !empty(storageAccountName) ? storageAccountName : '${abbrs.storageStorageAccounts}${resourceToken}'
    deploymentContainerName: 'app-package-${take(resourceToken, 7)}'
    vnetEnabled: vnetEnabled
  }
}

module serviceBus 'app/servicebus.bicep' = {
  name: 'servicebus'
  scope: rg
  params: {
    location: location
    tags: tags
    namespaceName: !empty(serviceBusNamespaceName) ? serviceBusNamespaceName : '${abbrs.serviceBusNamespaces}${resourceToken}'
    ordersQueueName: ordersQueueName
    agentRequestsQueueName: agentRequestsQueueName
    agentRepliesQueueName: agentRepliesQueueName
    operatorAlertsQueueName: operatorAlertsQueueName
    inboundQueueNames: inboundQueueNames
    statusQueueNames: statusQueueNames
    logAnalyticsWorkspaceId: monitoring.outputs.logAnalyticsWorkspaceId
    vnetEnabled: vnetEnabled
  }
}

module cosmos 'app/cosmos.bicep' = {
  name: 'cosmos'
  scope: rg
  params: {
    location: location
    tags: tags
    accountName: !empty(cosmosAccountName) ? cosmosAccountName : '${abbrs.documentDBDatabaseAccounts}${resourceToken}'
    capacityMode: cosmosCapacityMode
    autoscaleMaxThroughput: cosmosAutoscaleMaxThroughput
    ordersDatabaseName: ordersDatabaseName
    ordersContainerName: ordersContainerName
    stateDatabaseName: stateDatabaseName
    stateContainerName: stateContainerName
    checkpointContainerName: checkpointContainerName
    circuitBreakerContainerName: circuitBreakerContainerName
    recoveryIndexContainerName: recoveryIndexContainerName
    logAnalyticsWorkspaceId: monitoring.outputs.logAnalyticsWorkspaceId
    vnetEnabled: vnetEnabled
    backupTier: cosmosBackupTier
  }
}

module registry 'app/registry.bicep' = {
  name: 'registry'
  scope: rg
  params: {
    location: location
    tags: tags
    registryName: !empty(registryName) ? registryName : '${abbrs.containerRegistryRegistries}${resourceToken}'
  }
}

module rbac 'app/rbac.bicep' = {
  name: 'rbac'
  scope: rg
  params: {
    appPrincipalId: identity.outputs.appPrincipalId
    agentPrincipalId: identity.outputs.agentPrincipalId
    submittingApps: submittingApps
    inboundQueueNames: inboundQueueNames
    statusQueueNames: statusQueueNames
    legacyOrdersApp: legacyApp
    legacyOrdersQueueOpen: legacyOrdersQueueOpen
    operatorPrincipalId: operatorPrincipalId
    operatorPrincipalType: operatorPrincipalType
    serviceBusNamespaceName: serviceBus.outputs.namespaceName
    ordersQueueName: ordersQueueName
    agentRequestsQueueName: agentRequestsQueueName
    agentRepliesQueueName: agentRepliesQueueName
    operatorAlertsQueueName: operatorAlertsQueueName
    storageAccountName: storage.outputs.storageAccountName
    durableBackend: durableBackend
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    cosmosAccountName: cosmos.outputs.accountName
    ordersDatabaseName: ordersDatabaseName
    ordersContainerName: ordersContainerName
    stateDatabaseName: stateDatabaseName
    circuitBreakerContainerName: circuitBreakerContainerName
    registryName: registry.outputs.registryName
  }
}

module durableTaskScheduler 'app/durable-task-scheduler.bicep' = if (useDurableTaskScheduler) {
  name: 'durable-task-scheduler'
  scope: rg
  params: {
    location: location
    tags: tags
    schedulerName: !empty(durableTaskSchedulerName) ? durableTaskSchedulerName : '${abbrs.durableTaskSchedulers}${resourceToken}'
    taskHubName: taskHubName
    skuName: durableTaskSchedulerSku
    appPrincipalId: identity.outputs.appPrincipalId
    instanceRetentionSeconds: instanceRetentionSeconds
  }
}

module functionApp 'app/function.bicep' = {
  name: 'function'
  scope: rg
  dependsOn: [
    rbac
  ]
  params: {
    location: location
    tags: tags
    planName: !empty(functionPlanName) ? functionPlanName : '${abbrs.webServerFarms}${resourceToken}'
    functionAppName: !empty(functionAppName) ? functionAppName : '${abbrs.webSitesFunctions}${resourceToken}'
    identityId: identity.outputs.appIdentityId
    identityClientId: identity.outputs.appClientId
    storageBlobEndpoint: storage.outputs.blobEndpoint
    storageQueueEndpoint: storage.outputs.queueEndpoint
    storageTableEndpoint: storage.outputs.tableEndpoint
    deploymentContainerUrl: storage.outputs.deploymentContainerUrl
    applicationInsightsConnectionString: monitoring.outputs.applicationInsightsConnectionString
    logAnalyticsWorkspaceId: monitoring.outputs.logAnalyticsWorkspaceId
    serviceBusFullyQualifiedNamespace: serviceBus.outputs.fullyQualifiedNamespace
    serviceBusNamespaceResourceId: serviceBus.outputs.namespaceId
    cosmosEndpoint: cosmos.outputs.endpoint
    ordersQueueName: ordersQueueName
    agentRequestsQueueName: agentRequestsQueueName
    agentRepliesQueueName: agentRepliesQueueName
    operatorAlertsQueueName: operatorAlertsQueueName
    submittingApps: join(submittingAppNames, ',')
    legacyOrdersApp: hasLegacyApp ? legacyApp : 'none'
    maxPendingOrdersPerApp: maxPendingOrdersPerApp
    authClientId: operatorAuthClientId
    authTenantId: authTenantId
    operatorAppRole: operatorAppRole
    ordersDatabaseName: ordersDatabaseName
    ordersContainerName: ordersContainerName
    stateDatabaseName: stateDatabaseName
    stateContainerName: stateContainerName
    checkpointContainerName: checkpointContainerName
    circuitBreakerContainerName: circuitBreakerContainerName
    recoveryIndexContainerName: recoveryIndexContainerName
    durableBackend: durableBackend
    taskHubName: taskHubName
    durableTaskSchedulerEndpoint: useDurableTaskScheduler ? durableTaskScheduler.outputs.endpoint : ''
    maximumInstanceCount: functionMaximumInstanceCount
    instanceMemoryMB: functionInstanceMemoryMB
    alwaysReady: functionAlwaysReady
    appSettingOverrides: appSettingOverrides
    finishedOrderRetentionSeconds: finishedOrderRetentionSeconds
    instanceRetentionSeconds: instanceRetentionSeconds
    senderDeadLetterAlarmDepth: badInputThreshold
    virtualNetworkSubnetId: vnetEnabled ? network.outputs.appSubnetId : ''
    inboundPrivate: vnetEnabled
    publicDeployment: functionPublicDeployment
  }
}

module agent 'app/agent.bicep' = {
  name: 'agent'
  scope: rg
  dependsOn: [
    rbac
  ]
  params: {
    location: location
    tags: tags
    registryLoginServer: registry.outputs.loginServer
    environmentName: !empty(containerAppsEnvironmentName) ? containerAppsEnvironmentName : '${abbrs.appManagedEnvironments}${resourceToken}'
    containerAppName: !empty(agentContainerAppName) ? agentContainerAppName : '${abbrs.appContainerApps}agent-${resourceToken}'
    identityId: identity.outputs.agentIdentityId
    identityClientId: identity.outputs.agentClientId
    logAnalyticsWorkspaceId: monitoring.outputs.logAnalyticsWorkspaceId
    applicationInsightsConnectionString: monitoring.outputs.applicationInsightsConnectionString
    serviceBusFullyQualifiedNamespace: serviceBus.outputs.fullyQualifiedNamespace
    agentRequestsQueueName: agentRequestsQueueName
    agentRepliesQueueName: agentRepliesQueueName
    operatorAlertsQueueName: operatorAlertsQueueName
    cosmosEndpoint: cosmos.outputs.endpoint
    stateDatabaseName: stateDatabaseName
    circuitBreakerContainerName: circuitBreakerContainerName
    settingOverrides: appSettingOverrides
    agentRemoteUrl: agentRemoteUrl
    simulatorContainerAppName: useSimulator ? simulatorAppName : ''
    exists: agentExists
    replicas: agentReplicas
    infrastructureSubnetId: vnetEnabled ? network.outputs.agentSubnetId : ''
  }
}

// The Agent's remote service when none is configured (agentRemoteUrl empty): the simulator, internal ingress only.
module simulator 'app/simulator.bicep' = if (useSimulator) {
  name: 'simulator'
  scope: rg
  params: {
    location: location
    tags: tags
    containerAppName: simulatorAppName
    identityName: !empty(simulatorIdentityName) ? simulatorIdentityName : '${abbrs.managedIdentityUserAssignedIdentities}simulator-${resourceToken}'
    environmentId: agent.outputs.environmentId
    registryName: registry.outputs.registryName
    registryLoginServer: registry.outputs.loginServer
    exists: simulatorExists
  }
}

// ---------- private posture (vnetEnabled only): the VNet and one private endpoint per data service ----------
module network 'app/network.bicep' = if (vnetEnabled) {
  name: 'network'
  scope: rg
  params: {
    location: location
    tags: tags
    virtualNetworkName: !empty(virtualNetworkName) ? virtualNetworkName : 'vnet-${resourceToken}'
  }
}

// The privatelink zones of the public cloud's host names (Storage's from environment(), so other clouds work too).
module storageBlobPrivateEndpoint 'app/private-endpoint.bicep' = if (vnetEnabled) {
  name: 'pe-storage-blob'
  scope: rg
  params: {
    location: location
    tags: tags
    name: 'pe-blob-${resourceToken}'
    targetResourceId: storage.outputs.storageAccountId
    groupId: 'blob'
    privateDnsZoneName: 'privatelink.blob.${environment().suffixes.storage}'
    subnetId: vnetEnabled ? network.outputs.privateEndpointsSubnetId : ''
    virtualNetworkId: vnetEnabled ? network.outputs.virtualNetworkId : ''
  }
}

module storageQueuePrivateEndpoint 'app/private-endpoint.bicep' = if (vnetEnabled) {
  name: 'pe-storage-queue'
  scope: rg
  params: {
    location: location
    tags: tags
    name: 'pe-queue-${resourceToken}'
    targetResourceId: storage.outputs.storageAccountId
    groupId: 'queue'
    privateDnsZoneName: 'privatelink.queue.${environment().suffixes.storage}'
    subnetId: vnetEnabled ? network.outputs.privateEndpointsSubnetId : ''
    virtualNetworkId: vnetEnabled ? network.outputs.virtualNetworkId : ''
  }
}

module storageTablePrivateEndpoint 'app/private-endpoint.bicep' = if (vnetEnabled) {
  name: 'pe-storage-table'
  scope: rg
  params: {
    location: location
    tags: tags
    name: 'pe-table-${resourceToken}'
    targetResourceId: storage.outputs.storageAccountId
    groupId: 'table'
    privateDnsZoneName: 'privatelink.table.${environment().suffixes.storage}'
    subnetId: vnetEnabled ? network.outputs.privateEndpointsSubnetId : ''
    virtualNetworkId: vnetEnabled ? network.outputs.virtualNetworkId : ''
  }
}

module serviceBusPrivateEndpoint 'app/private-endpoint.bicep' = if (vnetEnabled) {
  name: 'pe-servicebus'
  scope: rg
  params: {
    location: location
    tags: tags
    name: 'pe-sb-${resourceToken}'
    targetResourceId: serviceBus.outputs.namespaceId
    groupId: 'namespace'
    privateDnsZoneName: 'privatelink.servicebus.windows.net'
    subnetId: vnetEnabled ? network.outputs.privateEndpointsSubnetId : ''
    virtualNetworkId: vnetEnabled ? network.outputs.virtualNetworkId : ''
  }
}

module cosmosPrivateEndpoint 'app/private-endpoint.bicep' = if (vnetEnabled) {
  name: 'pe-cosmos'
  scope: rg
  params: {
    location: location
    tags: tags
    name: 'pe-cosmos-${resourceToken}'
    targetResourceId: cosmos.outputs.accountId
    groupId: 'Sql'
    privateDnsZoneName: 'privatelink.documents.azure.com'
    subnetId: vnetEnabled ? network.outputs.privateEndpointsSubnetId : ''
    virtualNetworkId: vnetEnabled ? network.outputs.virtualNetworkId : ''
  }
}

// The function app's inbound side: its HTTP routes (and, with functionPublicDeployment false, its SCM endpoint) for
// clients in the VNet. The zone holds <app> and <app>.scm (privatelink.azurewebsites.net, public cloud).
module functionAppPrivateEndpoint 'app/private-endpoint.bicep' = if (vnetEnabled) {
  name: 'pe-function-app'
  scope: rg
  params: {
    location: location
    tags: tags
    name: 'pe-func-${resourceToken}'
    targetResourceId: functionApp.outputs.functionAppId
    groupId: 'sites'
    privateDnsZoneName: 'privatelink.azurewebsites.net'
    subnetId: vnetEnabled ? network.outputs.privateEndpointsSubnetId : ''
    virtualNetworkId: vnetEnabled ? network.outputs.virtualNetworkId : ''
  }
}

module alerts 'app/alerts.bicep' = {
  name: 'alerts'
  scope: rg
  params: {
    location: location
    tags: tags
    namePrefix: 'orderflow-${resourceToken}'
    serviceBusNamespaceId: serviceBus.outputs.namespaceId
    applicationInsightsId: monitoring.outputs.applicationInsightsId
    alertEmail: alertEmail
    supervisorSilenceMinutes: supervisorSilenceMinutes
    // The function app's SenderDeadLetterAlarmDepth is the same value (functionApp above).
    badInputThreshold: badInputThreshold
    // Queues only the product writes to: a dead letter there is a product fault (Sev-2).
    systemQueueNames: [
      agentRequestsQueueName
      agentRepliesQueueName
      operatorAlertsQueueName
    ]
    // Queues a sender fills (orders) or drains (statuses): their dead letters count towards a Sev-3 threshold.
    senderQueueNames: concat([ordersQueueName], inboundQueueNames, statusQueueNames)
  }
}

// The operations workbook: the figures of `orderflow summary` from Application Insights and the Service Bus metrics.
module workbook 'app/workbook.bicep' = {
  name: 'workbook'
  scope: rg
  params: {
    location: location
    tags: tags
    workbookName: !empty(workbookName) ? workbookName : guid(rg.id, 'orderflow-operations-workbook')
    displayName: workbookDisplayName
    applicationInsightsId: monitoring.outputs.applicationInsightsId
    serviceBusNamespaceId: serviceBus.outputs.namespaceId
  }
}

// ---------- outputs: azd writes each one into .azure/<env>/.env ----------
output AZURE_LOCATION string = location
output AZURE_TENANT_ID string = tenant().tenantId
output AZURE_RESOURCE_GROUP string = rg.name
output AZURE_CONTAINER_REGISTRY_ENDPOINT string = registry.outputs.loginServer
output AZURE_FUNCTION_APP_NAME string = functionApp.outputs.functionAppName
output AZURE_AGENT_CONTAINER_APP_NAME string = agent.outputs.containerAppName
// azure.yaml's simulator service deploys only when this is true (its `condition`).
output ORDERFLOW_SIMULATOR_DEPLOYED bool = useSimulator
output AGENT_REMOTE_SERVICE_URL string = agent.outputs.remoteUrl
output AZURE_APP_IDENTITY_CLIENT_ID string = identity.outputs.appClientId
output AZURE_AGENT_IDENTITY_CLIENT_ID string = identity.outputs.agentClientId
output SERVICEBUS_FULLY_QUALIFIED_NAMESPACE string = serviceBus.outputs.fullyQualifiedNamespace
output SERVICEBUS_NAMESPACE_RESOURCE_ID string = serviceBus.outputs.namespaceId
output ORDERS_QUEUE_NAME string = ordersQueueName
// What the postprovision hook (infra/hooks/postprovision.sh, .ps1) needs to list the senders on orders-inbound and on
// the namespace and keep the declared ones: the queue's id, the principals of the legacy app (while it may send
// there), the function app and the operators (docs/deploy.md, "Upgrading: stale senders on orders-inbound").
output ORDERS_QUEUE_RESOURCE_ID string = '${serviceBus.outputs.namespaceId}/queues/${ordersQueueName}'
output LEGACY_ORDERS_APP_PRINCIPAL_ID string = legacyOrdersSenderPrincipalId
output AZURE_APP_IDENTITY_PRINCIPAL_ID string = identity.outputs.appPrincipalId
output OPERATOR_PRINCIPAL_ID string = operatorPrincipalId
output INBOUND_QUEUE_NAMES string = join(inboundQueueNames, ',')
output LEGACY_ORDERS_APP string = hasLegacyApp ? legacyApp : 'none'
output STATUS_QUEUE_NAMES string = join(statusQueueNames, ',')
output OPERATOR_ALERTS_QUEUE_NAME string = operatorAlertsQueueName
output COSMOS_ENDPOINT string = cosmos.outputs.endpoint
output APPLICATIONINSIGHTS_CONNECTION_STRING string = monitoring.outputs.applicationInsightsConnectionString
output DURABLE_BACKEND string = durableBackend
// The operator API and the scope of its tokens (docs/deploy.md, "Operator sign-in").
output OPERATOR_API_URL string = 'https://${functionApp.outputs.defaultHostName}/api'
output OPERATOR_API_SCOPE string = 'api://${operatorAuthClientId}/user_impersonation'
output OPERATIONS_WORKBOOK_URL string = workbook.outputs.workbookUrl
output OPERATIONS_WORKBOOK_ID string = workbook.outputs.workbookId
