// Concern: the optional Durable Task Scheduler backend (durableBackend = 'DurableTaskScheduler'): a scheduler and
// its task hub. The app identity's Durable Task Data Contributor grant on the task hub is in rbac.bicep.
param location string
param tags object = {}
param schedulerName string
param taskHubName string
@allowed([
  'Consumption'
  'Dedicated'
])
param skuName string = 'Consumption'
@description('Principal id of the function app identity: Durable Task Data Contributor on the task hub.')
param appPrincipalId string

// Built-in role: Durable Task Data Contributor.
var durableTaskDataContributor = '0ad04412-c4d5-4796-b79c-f76d14c8d402'

resource scheduler 'Microsoft.DurableTask/schedulers@2025-11-01' = {
  name: schedulerName
  location: location
  tags: tags
  properties: {
    sku: {
      name: skuName
    }
    // An empty list denies all traffic; access is still Entra ID (RBAC) only. The private posture (vnetEnabled)
    // leaves the scheduler public: this API version (2025-11-01) has no publicNetworkAccess, and its private
    // endpoints (API 2026-02-01, group 'scheduler', zone privatelink.durabletask.io) were in limited preview when
    // this was written (docs/deploy.md, "Production posture").
    ipAllowlist: [
      '0.0.0.0/0'
    ]
  }

  resource taskHub 'taskHubs' = {
    name: taskHubName
  }
}

resource appUsesTaskHub 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(scheduler::taskHub.id, appPrincipalId, durableTaskDataContributor)
  scope: scheduler::taskHub
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', durableTaskDataContributor)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

output schedulerName string = scheduler.name
output taskHubName string = scheduler::taskHub.name
output endpoint string = scheduler.properties.endpoint
