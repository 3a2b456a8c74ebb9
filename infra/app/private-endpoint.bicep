// Concern: one private endpoint of one data service in the private posture (main.bicep vnetEnabled = true;
// deployed only then): the endpoint in the 'private-endpoints' subnet, the service's privatelink DNS zone, the zone's
// link to the VNet (so the service's ordinary host name resolves to the private IP inside it) and the endpoint's DNS
// zone group (which writes the A record). Each caller has its own zone (blob, queue, table, Service Bus, Cosmos DB),
// so one module per endpoint owns its zone. Types: Microsoft.Network/privateEndpoints(/privateDnsZoneGroups)
// @2024-05-01, Microsoft.Network/privateDnsZones(/virtualNetworkLinks)@2024-06-01 (Azure/bicep-types-az).
param location string
param tags object = {}
@description('Name of the private endpoint.')
param name string
@description('Resource id of the service the endpoint connects to.')
param targetResourceId string
@description('Private-link group (sub-resource) of the target: blob, queue, table, namespace, Sql.')
param groupId string
@description('The privatelink DNS zone of that group, e.g. privatelink.blob.core.windows.net.')
param privateDnsZoneName string
param subnetId string
param virtualNetworkId string

resource privateDnsZone 'Microsoft.Network/privateDnsZones@2024-06-01' = {
  name: privateDnsZoneName
  location: 'global'
  tags: tags
}

resource virtualNetworkLink 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2024-06-01' = {
  parent: privateDnsZone
  name: last(split(virtualNetworkId, '/'))
  location: 'global'
  tags: tags
  properties: {
    registrationEnabled: false
    virtualNetwork: {
      id: virtualNetworkId
    }
  }
}

resource privateEndpoint 'Microsoft.Network/privateEndpoints@2024-05-01' = {
  name: name
  location: location
  tags: tags
  properties: {
    subnet: {
      id: subnetId
    }
    privateLinkServiceConnections: [
      {
        name: name
        properties: {
          privateLinkServiceId: targetResourceId
          groupIds: [
            groupId
          ]
        }
      }
    ]
  }
}

resource privateDnsZoneGroup 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2024-05-01' = {
  parent: privateEndpoint
  name: 'default'
  properties: {
    privateDnsZoneConfigs: [
      {
        name: replace(privateDnsZoneName, '.', '-')
        properties: {
          privateDnsZoneId: privateDnsZone.id
        }
      }
    ]
  }
}

output privateEndpointId string = privateEndpoint.id
output privateDnsZoneId string = privateDnsZone.id
