// Concern: the storage account of the Functions host (AzureWebJobsStorage), the Durable task hub (Azure Storage
// backend: queues, tables, blobs) and the Flex Consumption deployment package container. Identity only: shared
// keys are disabled, so no connection string to it exists.
param location string
param tags object = {}
param storageAccountName string
param deploymentContainerName string
@description('Private posture (main.bicep vnetEnabled): no public network access; reached through private endpoints.')
param vnetEnabled bool = false

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: storageAccountName
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    allowSharedKeyAccess: false
    allowBlobPublicAccess: false
    allowCrossTenantReplication: false
    defaultToOAuthAuthentication: true
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    // Private posture: public access off and the firewall denies by default; blob, queue and table are reached
    // through private endpoints (main.bicep). Otherwise public, identity only, as before.
    publicNetworkAccess: vnetEnabled ? 'Disabled' : 'Enabled'
    networkAcls: {
      defaultAction: vnetEnabled ? 'Deny' : 'Allow'
      bypass: 'AzureServices'
    }
  }

  resource blobService 'blobServices' = {
    name: 'default'

    resource deploymentContainer 'containers' = {
      name: deploymentContainerName
      properties: {
        publicAccess: 'None'
      }
    }
  }
}

output storageAccountId string = storage.id
output storageAccountName string = storage.name
output blobEndpoint string = storage.properties.primaryEndpoints.blob
output queueEndpoint string = storage.properties.primaryEndpoints.queue
output tableEndpoint string = storage.properties.primaryEndpoints.table
output deploymentContainerUrl string = '${storage.properties.primaryEndpoints.blob}${deploymentContainerName}'
