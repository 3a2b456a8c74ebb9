// Concern: the Agent worker (`python -m agent`) hosted on Azure Container Apps: a long-running process, not a
// function, so it runs as a container with its own user-assigned identity and a KEDA `azure-servicebus` scale
// rule on agent-requests that authenticates with that identity (no connection string). The image is built by azd
// from infra/agent/Dockerfile and pulled (with the identity's AcrPull grant) from registry.bicep's registry.
// minReplicas defaults to 1: KEDA's azure-servicebus scaler reads the queue length through the Service Bus
// management API, which needs the Manage right (Data Owner) that this design grants nobody; without it the scale
// rule cannot add replicas, and one replica always runs (see docs/deploy.md, "Agent hosting").
param location string
param tags object = {}
@description('Login server of the registry the Agent image is pulled from (AcrPull granted in rbac.bicep).')
param registryLoginServer string
param environmentName string
param containerAppName string
param identityId string
param identityClientId string
param logAnalyticsWorkspaceId string
param serviceBusNamespaceName string
param serviceBusFullyQualifiedNamespace string
param agentRequestsQueueName string
param agentRepliesQueueName string
param operatorAlertsQueueName string
@description('Base URL of the remote service the Agent calls for each step.')
param agentRemoteUrl string
@minValue(0)
param minReplicas int = 1
@minValue(1)
param maxReplicas int = 10
@description('Active messages on agent-requests per replica before KEDA adds one.')
param messagesPerReplica int = 20
@description('Image to start with; azd deploy replaces it with the built Agent image.')
param image string = 'mcr.microsoft.com/azuredocs/containerapps-helloworld:latest'

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
          image: image
          command: [
            'python'
            '-m'
            'agent'
          ]
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
            { name: 'AGENT_REMOTE_URL', value: agentRemoteUrl }
          ]
        }
      ]
      scale: {
        minReplicas: minReplicas
        maxReplicas: maxReplicas
        rules: [
          {
            name: 'agent-requests'
            custom: {
              type: 'azure-servicebus'
              identity: identityId
              metadata: {
                namespace: serviceBusNamespaceName
                queueName: agentRequestsQueueName
                messageCount: string(messagesPerReplica)
              }
            }
          }
        ]
      }
    }
  }
}

output containerAppName string = agent.name
output environmentName string = environment.name
