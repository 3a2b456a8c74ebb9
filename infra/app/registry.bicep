// Concern: the container registry the Agent image is pushed to by azd and pulled from by the Agent's identity
// (AcrPull in rbac.bicep). No admin user, no anonymous pull: no registry password exists.
param location string
param tags object = {}
param registryName string

resource registry 'Microsoft.ContainerRegistry/registries@2023-07-01' = {
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
