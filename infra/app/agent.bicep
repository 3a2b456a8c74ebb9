// Concern: the Agent worker (`python -m agent`) hosted on Azure Container Apps: a long-running process, not a
// function, so it runs as a container with its own user-assigned identity. The image is built by azd from
// infra/agent/Dockerfile and pulled (with the identity's AcrPull grant) from registry.bicep's registry.
// Image and command: a new app starts the placeholder image, which runs its own entrypoint; `azd deploy` then
// replaces the image only (azure-dev cli/azd/pkg/containerapps/container_app.go, AddRevision), so no command is set
// here and the Agent image's own CMD (`python -m agent`) runs. A re-provision keeps the deployed image
// (container-image.bicep, azd's exists pattern).
// Fixed replicas (minReplicas == maxReplicas == replicas), no scale rule: KEDA's azure-servicebus scaler reads the
// queue length through the Service Bus management API, which needs the Manage right (Data Owner) that this design
// grants nobody, so a queue-length rule would never add a replica (docs/deploy.md, "Agent telemetry and scaling").
// Telemetry: the Agent exports to Application Insights like the function app, with Entra ID ingestion as its own
// identity (Monitoring Metrics Publisher in rbac.bicep); agent/__main__.py calls telemetry.configure_from_env().
// Circuit breaker (issue 11): every Agent replica shares one breaker document per remote service in Cosmos DB
// (container CircuitBreakerContainerName of the state database), reached with the Agent's identity, whose only Cosmos
// grant is a custom role on that container (read, create, replace items: rbac.bicep). Its tunables are the function
// app's (the registered defaults, or appSettingOverrides), so the Starter and the Agent read the breaker alike.
// Liveness: Container Apps restarts a replica whose GET http://<replica>:AGENT_HEALTH_PORT/healthz fails
// (timeout or a status outside 200-399) livenessFailureThreshold times in a row. agent/health.py answers from the
// Agent's own event loop: 200 while the Agent's serve task runs and no stop was requested, 503 otherwise. So the probe
// catches a blocked event loop (no answer in time) and an Agent whose serve task has ended or that hangs while
// stopping (503); restarting is the repair. It does not look at the receive loops themselves: one that stopped while
// the serve task still runs goes unseen (200), and the Supervisor recovers its orders after their deadlines.
// Container Apps probes are httpGet or tcpSocket only; a TCP accept succeeds while the event loop is blocked (the
// kernel completes the handshake), so only an HTTP answer shows the process is alive. The probe needs no ingress. The
// placeholder image of a new app has no such endpoint, so the probe is set only once the app runs an image azd
// deployed (the next provision after the first `azd deploy`: docs/deploy.md, "Agent health").
param location string
param tags object = {}
@description('Login server of the registry the Agent image is pulled from (AcrPull granted in rbac.bicep).')
param registryLoginServer string
param environmentName string
param containerAppName string
param identityId string
param identityClientId string
param logAnalyticsWorkspaceId string
@description('Locates the Application Insights ingestion endpoint; with local auth disabled it grants nothing (not a secret).')
param applicationInsightsConnectionString string
param serviceBusFullyQualifiedNamespace string
param agentRequestsQueueName string
param agentRepliesQueueName string
param operatorAlertsQueueName string
@description('Cosmos DB account endpoint (no key): the Agent opens the circuit-breaker container only.')
param cosmosEndpoint string
param stateDatabaseName string
param circuitBreakerContainerName string
@description('The function app\'s appSettingOverrides: the Agent takes RemoteServiceName and CircuitBreaker* from it.')
param settingOverrides object = {}
@description('Base URL of the remote service the Agent calls for each step; empty: the simulator below.')
param agentRemoteUrl string
@description('Container app of the remote-service simulator (simulator.bicep) in this environment, called when agentRemoteUrl is empty.')
param simulatorContainerAppName string = ''
@description('Agent replicas, always running (no scale rule: see the header).')
@minValue(1)
param replicas int = 2
@description('azd: SERVICE_AGENT_RESOURCE_EXISTS. True once the app exists: it keeps the image it runs.')
param exists bool = false
@description('Image of a new app until azd deploy replaces it with the Agent image; it runs its own entrypoint.')
param placeholderImage string = 'mcr.microsoft.com/azuredocs/containerapps-helloworld:latest'
@description('Private posture (main.bicep vnetEnabled): the Container Apps environment\'s subnet; empty for none.')
param infrastructureSubnetId string = ''

// The breaker's settings, as the function app gets them (function.bicep codeSettings: the registered defaults of
// orderflow/settings.py), with the same overrides applied.
// The Agent's health endpoint (agent/: GET /healthz on this port, all interfaces) and its liveness probe.
var healthPort = 8080
var livenessProbe = {
  type: 'Liveness'
  httpGet: {
    path: '/healthz'
    port: healthPort
    scheme: 'HTTP'
  }
  initialDelaySeconds: 10
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
}
var runsDeployedImage = image.outputs.image != placeholderImage

var breakerSettings = union({
  RemoteServiceName: 'fulfilment'
  CircuitBreakerFailureThreshold: '10'
  CircuitBreakerWindowSeconds: '30'
  CircuitBreakerCooldownSeconds: '15'
  CircuitBreakerMaxCooldownSeconds: '300'
  CircuitBreakerProbes: '2'
}, settingOverrides)

// The simulator's internal ingress: https://<app>.internal.<environment default domain>, reachable from the apps of
// the same environment only (https://learn.microsoft.com/azure/container-apps/ingress-overview, "Internal").
var remoteUrl = !empty(agentRemoteUrl)
  ? agentRemoteUrl
  : 'https://${simulatorContainerAppName}.internal.${environment.properties.defaultDomain}'

module image 'container-image.bicep' = {
  name: 'agent-image'
  params: {
    exists: exists
    containerAppName: containerAppName
    placeholderImage: placeholderImage
  }
}

// Logs go to Azure Monitor through a diagnostic setting: the 'log-analytics' destination would need the
// workspace shared key.
resource environment 'Microsoft.App/managedEnvironments@2025-01-01' = {
  name: environmentName
  location: location
  tags: tags
  properties: {
    appLogsConfiguration: {
      destination: 'azure-monitor'
    }
    // Private posture: the environment joins the VNet's 'agent' subnet (a /23, not delegated: this is a
    // Consumption-only environment), so the Agent reaches Service Bus and Cosmos DB through their private
    // endpoints. Internal: the Agent has no ingress, so the environment gets no public IP. A VNet can only be set
    // when the environment is created. Null, as if absent, otherwise.
    vnetConfiguration: !empty(infrastructureSubnetId) ? {
      infrastructureSubnetId: infrastructureSubnetId
      internal: true
    } : null
  }
}

resource environmentDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: environment
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

resource agent 'Microsoft.App/containerApps@2025-01-01' = {
  name: containerAppName
  location: location
  tags: union(tags, { 'azd-service-name': 'agent' })
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    managedEnvironmentId: environment.id
    configuration: {
      activeRevisionsMode: 'Single'
      // No ingress: the Agent only pulls from Service Bus.
      registries: [
        {
          server: registryLoginServer
          identity: identityId
        }
      ]
    }
    template: {
      containers: [
        {
          name: 'agent'
          image: image.outputs.image
          resources: {
            cpu: json('0.5')
            memory: '1Gi'
          }
          env: [
            { name: 'AgentRequestsQueueName', value: agentRequestsQueueName }
            { name: 'AgentRepliesQueueName', value: agentRepliesQueueName }
            { name: 'OperatorAlertsQueueName', value: operatorAlertsQueueName }
            { name: 'ServiceBusConnection__fullyQualifiedNamespace', value: serviceBusFullyQualifiedNamespace }
            { name: 'AZURE_CLIENT_ID', value: identityClientId }
            { name: 'AGENT_REMOTE_URL', value: remoteUrl }
            // The circuit-breaker documents: identity-based (CosmosDb__clientId, as orderflow.adapters reads it).
            { name: 'CosmosDb__accountEndpoint', value: cosmosEndpoint }
            { name: 'CosmosDb__clientId', value: identityClientId }
            { name: 'StateDatabaseName', value: stateDatabaseName }
            { name: 'CircuitBreakerContainerName', value: circuitBreakerContainerName }
            { name: 'RemoteServiceName', value: breakerSettings.RemoteServiceName }
            { name: 'CircuitBreakerFailureThreshold', value: breakerSettings.CircuitBreakerFailureThreshold }
            { name: 'CircuitBreakerWindowSeconds', value: breakerSettings.CircuitBreakerWindowSeconds }
            { name: 'CircuitBreakerCooldownSeconds', value: breakerSettings.CircuitBreakerCooldownSeconds }
            { name: 'CircuitBreakerMaxCooldownSeconds', value: breakerSettings.CircuitBreakerMaxCooldownSeconds }
            { name: 'CircuitBreakerProbes', value: breakerSettings.CircuitBreakerProbes }
            // Telemetry, as the function app gets it (function.bicep): Entra ID ingestion as the Agent's identity.
            { name: 'APPLICATIONINSIGHTS_CONNECTION_STRING', value: applicationInsightsConnectionString }
            { name: 'APPLICATIONINSIGHTS_AUTHENTICATION_STRING', value: 'ClientId=${identityClientId};Authorization=AAD' }
            { name: 'OTEL_SERVICE_NAME', value: 'orderflow-agent' }
            // The port of the health endpoint the liveness probe calls.
            { name: 'AGENT_HEALTH_PORT', value: string(healthPort) }
          ]
          probes: runsDeployedImage ? [
            livenessProbe
          ] : []
        }
      ]
      scale: {
        minReplicas: replicas
        maxReplicas: replicas
      }
    }
  }
}

output containerAppName string = agent.name
output environmentName string = environment.name
output environmentId string = environment.id
output remoteUrl string = remoteUrl
