// Concern: the virtual network of the private posture (main.bicep vnetEnabled = true; deployed only then). Three
// subnets, the shapes the official Flex Consumption samples use (Azure-Samples/functions-quickstart-python-http-azd
// infra/app/vnet.bicep), plus one for the Container Apps environment:
// - 'app': the function app's regional VNet integration. Flex Consumption requires the subnet to be delegated to
//   Microsoft.App/environments.
// - 'private-endpoints': the private endpoints of Storage (blob, queue, table), Service Bus and Cosmos DB
//   (private-endpoint.bicep); network policies off, as the samples have them.
// - 'agent': the Agent's Container Apps environment. That environment is Consumption-only (it declares no workload
//   profiles), which needs a dedicated /23 that is NOT delegated (a workload-profiles environment would take a /27
//   delegated to Microsoft.App/environments instead).
// No network security group: the samples attach none, and the default rules (VNet-internal traffic and outbound
// allowed, inbound from the internet denied) are what this design needs. Types: Microsoft.Network/virtualNetworks
// @2024-05-01 (addressSpace, subnets[].properties: addressPrefix, delegations[].properties.serviceName,
// privateEndpointNetworkPolicies), checked against Azure/bicep-types-az generated/network.
param location string
param tags object = {}
param virtualNetworkName string
param addressPrefix string = '10.0.0.0/16'
param appSubnetPrefix string = '10.0.1.0/24'
param privateEndpointsSubnetPrefix string = '10.0.2.0/24'
@description('The Container Apps environment subnet: /23 at least (Consumption-only environment).')
param agentSubnetPrefix string = '10.0.4.0/23'

var appSubnetName = 'app'
var privateEndpointsSubnetName = 'private-endpoints'
var agentSubnetName = 'agent'

resource virtualNetwork 'Microsoft.Network/virtualNetworks@2024-05-01' = {
  name: virtualNetworkName
  location: location
  tags: tags
  properties: {
    addressSpace: {
      addressPrefixes: [
        addressPrefix
      ]
    }
    subnets: [
      {
        name: appSubnetName
        properties: {
          addressPrefix: appSubnetPrefix
          privateEndpointNetworkPolicies: 'Disabled'
          privateLinkServiceNetworkPolicies: 'Enabled'
          delegations: [
            {
              name: 'flex-consumption'
              properties: {
                serviceName: 'Microsoft.App/environments'
              }
            }
          ]
        }
      }
      {
        name: privateEndpointsSubnetName
        properties: {
          addressPrefix: privateEndpointsSubnetPrefix
          privateEndpointNetworkPolicies: 'Disabled'
          privateLinkServiceNetworkPolicies: 'Enabled'
        }
      }
      {
        name: agentSubnetName
        properties: {
          addressPrefix: agentSubnetPrefix
        }
      }
    ]
  }
}

output virtualNetworkId string = virtualNetwork.id
output virtualNetworkName string = virtualNetwork.name
output appSubnetId string = resourceId('Microsoft.Network/virtualNetworks/subnets', virtualNetwork.name, appSubnetName)
output privateEndpointsSubnetId string = resourceId('Microsoft.Network/virtualNetworks/subnets', virtualNetwork.name, privateEndpointsSubnetName)
output agentSubnetId string = resourceId('Microsoft.Network/virtualNetworks/subnets', virtualNetwork.name, agentSubnetName)
