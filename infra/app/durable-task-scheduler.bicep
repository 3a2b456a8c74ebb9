// Concern: the optional Durable Task Scheduler backend (durableBackend = 'DurableTaskScheduler'): a scheduler, its
// task hub and its retention policy for finished orchestrations. The app identity's Durable Task Data Contributor grant
// on the task hub is in rbac.bicep.
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
@description('App setting InstanceRetentionSeconds: how long finished orchestrations are kept (0: as long as the scheduler allows).')
@minValue(0)
param instanceRetentionSeconds int = 2592000

// Built-in role: Durable Task Data Contributor.
var durableTaskDataContributor = '0ad04412-c4d5-4796-b79c-f76d14c8d402'

// Issue 26: the scheduler's own purge of finished orchestrations (autopurge), set to the retention of the app's purge
// timer (app setting InstanceRetentionSeconds, which purges through the Durable client on either backend), in whole
// days: rounded up (Bicep's `/` on integers truncates, so (s + 86399) / 86400 is the ceiling), at least 1. The
// scheduler takes 0 to 90 days, 0 meaning "purge as soon as possible" (the opposite of the app's 0, "never purge"),
// and purges 30 days after completion when no policy is set; so InstanceRetentionSeconds 0, or more than 90 days,
// gives the most it keeps: 90 days. Its clock starts when an orchestration reaches a terminal state, the app's
// purge counts from the instance's creation: below 90 days the scheduler never purges before the app would.
// (Set autopurge retention policies for Durable Task Scheduler,
// https://learn.microsoft.com/azure/durable-task/scheduler/durable-task-scheduler-auto-purge)
var secondsPerDay = 86400
var maxRetentionDays = 90
var instanceRetentionDays = instanceRetentionSeconds == 0
  ? maxRetentionDays
  : min(maxRetentionDays, max(1, (instanceRetentionSeconds + secondsPerDay - 1) / secondsPerDay))

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

  // One policy without orchestrationState: it applies to every purgeable (terminal) state, Completed, Failed,
  // Canceled and Terminated, in every task hub of the scheduler; the app's purge covers Completed, Failed and
  // Terminated. Schema: Microsoft.DurableTask/schedulers/retentionPolicies@2025-11-01, name 'default' (the only one),
  // properties.retentionPolicies: RetentionPolicyDetails[] { orchestrationState?, retentionPeriodInDays }
  // (Azure/bicep-types-az generated/durabletask/microsoft.durabletask/2025-11-01/types.md;
  // https://learn.microsoft.com/azure/templates/microsoft.durabletask/schedulers/retentionpolicies).
  resource retentionPolicy 'retentionPolicies' = {
    name: 'default'
    properties: {
      retentionPolicies: [
        {
          retentionPeriodInDays: instanceRetentionDays
        }
      ]
    }
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
