// Concern: the user-defined types of the array parameters (main.bicep and the modules it passes them to), so a
// malformed entry fails when the template is compiled, not half-way through a deployment. Types only: no resource.

@export()
@description('A submitting application: it sends its orders to its own inbound queue "<name>-orders" and reads their statuses on "<name>-status"; its principal (when not empty) may send to that inbound queue (and to orders-inbound if it is the legacy app) and receive from that status queue, nothing else.')
type submittingApp = {
  @minLength(1)
  @maxLength(24)
  @description('Application name: 1-24 of a-z 0-9 -, starting with a letter (orderflow/apps.py APP_NAME_PATTERN; the app refuses to start otherwise). Its queues are "<name>-orders" and "<name>-status", its submission function "submission-<name>".')
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
