// Concern: the user-defined types of the array parameters (main.bicep and the modules it passes them to), so a
// malformed entry fails when the template is compiled, not half-way through a deployment. Types only: no resource.

@export()
@description('A submitting application: its status queue is "<name>-status"; its principal (when not empty) may send to orders-inbound and receive from its own status queue.')
type submittingApp = {
  @minLength(1)
  @maxLength(43)
  @description('Application name; the status queue is "<name>-status", which must be a reply queue name (at most 50 characters: orderflow/messages.py QUEUE_NAME_PATTERN), so at most 43.')
  name: string

  @description('Object id of its identity; empty for no grant.')
  principalId: string

  @description('Type of that principal (azd fills AZURE_PRINCIPAL_TYPE with User or ServicePrincipal). Default: ServicePrincipal.')
  principalType: ('User' | 'ServicePrincipal' | 'Group')?
}

@export()
@description('A Flex Consumption always-ready entry (Microsoft.Web/sites functionAppConfig.scaleAndConcurrency.alwaysReady).')
type alwaysReadyEntry = {
  @minLength(1)
  @description('A function group (\'http\', \'blob\', \'durable\') or \'function:<name>\'.')
  name: string

  @minValue(0)
  @description('Instances kept ready for that group or function.')
  instanceCount: int
}
