// Concern: the user-assigned managed identities. One for the function app (Scheduler, Starter, Supervisor,
// triggers), one for the Agent worker. Every grant in rbac.bicep names one of these principals.
param location string
param tags object = {}
param appIdentityName string
param agentIdentityName string

resource appIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: appIdentityName
  location: location
  tags: tags
}

resource agentIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: agentIdentityName
  location: location
  tags: tags
}

output appIdentityId string = appIdentity.id
output appPrincipalId string = appIdentity.properties.principalId
output appClientId string = appIdentity.properties.clientId
output agentIdentityId string = agentIdentity.id
output agentPrincipalId string = agentIdentity.properties.principalId
output agentClientId string = agentIdentity.properties.clientId
