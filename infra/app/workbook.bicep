// Concern: the operations workbook (issue 14): the figures of `orderflow summary` in the portal, from Application
// Insights (workspace-based, so its data lives in the Log Analytics workspace) and from the Service Bus namespace's
// platform metrics. The workbook's definition is workbook.json (export it again from the portal's Advanced Editor
// after editing it there); its two resource ids are placeholders replaced here, so the JSON stays environment-free.
// A shared workbook holds no credential: whoever opens it reads the data with their own Entra ID identity
// (Monitoring Reader on the component and the namespace is enough).
param location string
param tags object = {}
@description('Resource name of the workbook: it must be a GUID (Microsoft.Insights/workbooks).')
param workbookName string
@description('Name shown in the Workbooks gallery; unique within the resource group.')
param displayName string
@description('The Application Insights component the KQL tiles query (and the workbook\'s gallery home, sourceId).')
param applicationInsightsId string
@description('The Service Bus namespace whose DeadletteredMessages metric the dead-letter tiles read.')
param serviceBusNamespaceId string

var definition = loadTextContent('workbook.json')
var serializedData = replace(
  replace(definition, '__APPLICATION_INSIGHTS_ID__', applicationInsightsId),
  '__SERVICE_BUS_NAMESPACE_ID__',
  serviceBusNamespaceId
)

resource workbook 'Microsoft.Insights/workbooks@2023-06-01' = {
  name: workbookName
  location: location
  tags: tags
  kind: 'shared'
  properties: {
    displayName: displayName
    description: 'orderflow operations: the figures of `orderflow summary` (orders per state, dead letters, breakers, Supervisor, throughput, latency, operator alerts).'
    category: 'workbook'
    version: 'Notebook/1.0'
    sourceId: applicationInsightsId
    serializedData: serializedData
  }
}

output workbookId string = workbook.id
// The portal's own deep link to a shared workbook, as Microsoft's workbook quickstart builds it
// (Azure/azure-quickstart-templates quickstarts/microsoft.costmanagement/optimization-workbook/main.bicep, output
// workbookUrl): the Workbooks blade with the workbook's source resource (ComponentId) and the workbook's id
// (ConfigurationId). environment().portal keeps it right in other clouds.
output workbookUrl string = '${environment().portal}/#view/AppInsightsExtension/UsageNotebookBlade/ComponentId/${uriComponent(applicationInsightsId)}/ConfigurationId/${uriComponent(workbook.id)}/Type/workbook/WorkbookTemplateName/${uriComponent(displayName)}'
