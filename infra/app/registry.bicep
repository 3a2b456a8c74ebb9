// Concern: the container registry the Agent image is pushed to by azd and pulled from by the Agent's identity
// (AcrPull in rbac.bicep). No admin user, no anonymous pull: no registry password exists.
// API 2025-04-01: the first GA version whose registries type has anonymousPullEnabled (GA 2022-12-01 and 2023-07-01
// have not; previews have it since 2023-01-01-preview). Kept explicit rather than dropped: docs/deploy.md,
// "Deployment fixes".
param location string
param tags object = {}
param registryName string

resource registry 'Microsoft.ContainerRegistry/registries@2025-04-01' = {
  name: registryName
  location: location
  tags: tags
  sku: {
    name: 'Basic'
  }
  properties: {
    adminUserEnabled: false
    anonymousPullEnabled: false
    publicNetworkAccess: 'Enabled'
  }
}

output registryName string = registry.name
output loginServer string = registry.properties.loginServer
