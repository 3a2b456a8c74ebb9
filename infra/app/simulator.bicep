// Concern: the remote-service simulator (`python -m lab.simulator`, lab/simulator.py) as the Agent's remote
// service when none is configured: main.bicep deploys this module exactly when agentRemoteUrl is empty, and the
// Agent then calls https://<this app>.internal.<environment domain> (agent.bicep). It runs in the Agent's
// environment with internal ingress only, fixed at one replica (its effects ledger is one SQLite file in the
// container, lost on a restart: a stand-in for trying the system, never a production service), on its own image
// (infra/agent/Dockerfile.simulator, azure.yaml service "simulator"), whose CMD listens on port 80, the port the
// placeholder image of a new app listens on too, so the ingress fits both. Its identity may only pull that image: the
// grant lives and goes with this module, so no other module names a principal that may not exist.
param location string
param tags object = {}
param containerAppName string
param identityName string
@description('The Agent\'s Container Apps environment (agent.bicep).')
param environmentId string
param registryName string
param registryLoginServer string
@description('azd: SERVICE_SIMULATOR_RESOURCE_EXISTS. True once the app exists: it keeps the image it runs.')
param exists bool = false
@description('Image of a new app until azd deploy replaces it with the simulator image; it runs its own entrypoint.')
param placeholderImage string = 'mcr.microsoft.com/azuredocs/containerapps-helloworld:latest'

var acrPull = '7f951dda-4ed3-4680-a7ca-43fe172d538d'

resource registry 'Microsoft.ContainerRegistry/registries@2023-07-01' existing = {
  name: registryName
}

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: identityName
  location: location
  tags: tags
}

resource pullsImage 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(registry.id, identity.properties.principalId, acrPull)
  scope: registry
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', acrPull)
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

module image 'container-image.bicep' = {
  name: 'simulator-image'
  params: {
    exists: exists
    containerAppName: containerAppName
    placeholderImage: placeholderImage
  }
}

resource simulator 'Microsoft.App/containerApps@2025-01-01' = {
  name: containerAppName
  location: location
  tags: union(tags, { 'azd-service-name': 'simulator' })
  dependsOn: [
    pullsImage
  ]
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identity.id}': {}
    }
  }
  properties: {
    managedEnvironmentId: environmentId
    configuration: {
      activeRevisionsMode: 'Single'
      ingress: {
        external: false
        targetPort: 80
        transport: 'http'
        allowInsecure: false
      }
      registries: [
        {
          server: registryLoginServer
          identity: identity.id
        }
      ]
    }
    template: {
      containers: [
        {
          // No command: the image's CMD runs (the placeholder's, then the simulator's; see agent.bicep).
          name: 'simulator'
          image: image.outputs.image
          resources: {
            cpu: json('0.25')
            memory: '0.5Gi'
          }
        }
      ]
      scale: {
        minReplicas: 1
        maxReplicas: 1
      }
    }
  }
}

output containerAppName string = simulator.name
