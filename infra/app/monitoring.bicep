// Concern: telemetry sinks. Log Analytics (every diagnostic setting writes here) and a workspace-based
// Application Insights that accepts only Entra ID (AAD) authenticated ingestion (DisableLocalAuth).
param location string
param tags object = {}
param logAnalyticsName string
param applicationInsightsName string
@minValue(30)
param retentionInDays int = 30

resource logAnalytics 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: logAnalyticsName
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: retentionInDays
    features: {
      disableLocalAuth: true
    }
  }
}

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: applicationInsightsName
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: logAnalytics.id
    DisableLocalAuth: true
    IngestionMode: 'LogAnalytics'
  }
}

output logAnalyticsWorkspaceId string = logAnalytics.id
output applicationInsightsId string = applicationInsights.id
output applicationInsightsName string = applicationInsights.name
// The connection string only locates the ingestion endpoint: with DisableLocalAuth it grants nothing without an
// Entra ID token (APPLICATIONINSIGHTS_AUTHENTICATION_STRING), so it is not a secret.
output applicationInsightsConnectionString string = applicationInsights.properties.ConnectionString
