// Concern: the signals that mean an operator must act, as Azure Monitor alert rules, routed to an optional e-mail
// action group:
//  - dead-lettered messages above 0 on any queue (a poison message or an expired one: never silently dropped);
//  - orders in Error (the `orderflow.orders.error` custom metric or an operator-alert log line);
//  - the Supervisor not running (no `supervisor` execution for supervisorSilenceMinutes);
//  - a circuit breaker open (issue 11): the gauge `orderflow.circuit.state` (0 closed, 1 half-open, 2 open; attribute
//    `service`) that the Agent reports (orderflow/telemetry.py) reads 2 for a remote service.
// The metric and log names are the telemetry contract with orderflow's OpenTelemetry instrumentation: every name an
// alert queries is one the code emits (tests/infra/test_infra_telemetry.py).
param location string
param tags object = {}
param namePrefix string
param serviceBusNamespaceId string
param applicationInsightsId string
@description('E-mail address that receives the alerts; empty for none (the alerts still fire in the portal).')
param alertEmail string = ''
@minValue(5)
param supervisorSilenceMinutes int = 15

var ordersErrorMetric = 'orderflow.orders.error'
// The start of the log line orderflow.outbound.raise_alert writes for every operator alert.
var operatorAlertLogPrefix = 'operator alert '
var supervisorFunctionName = 'supervisor'
// The breaker's state gauge and the value that means open (orderflow.breaker: 0 closed, 1 half-open, 2 open).
var circuitStateMetric = 'orderflow.circuit.state'
var circuitOpenState = 2
var actions = empty(alertEmail) ? [] : [ actionGroup.id ]

resource actionGroup 'Microsoft.Insights/actionGroups@2023-01-01' = if (!empty(alertEmail)) {
  name: '${namePrefix}-operators'
  location: 'global'
  tags: tags
  properties: {
    groupShortName: 'orderflow'
    enabled: true
    emailReceivers: [
      {
        name: 'operators'
        emailAddress: alertEmail
        useCommonAlertSchema: true
      }
    ]
  }
}

resource deadLetters 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: '${namePrefix}-dead-lettered-messages'
  location: 'global'
  tags: tags
  properties: {
    description: 'A message was dead-lettered on a queue: inspect the dead-letter sub-queue and its reason.'
    severity: 1
    enabled: true
    scopes: [
      serviceBusNamespaceId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'dead-lettered'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'DeadletteredMessages'
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Maximum'
        }
      ]
    }
    actions: [for id in actions: { actionGroupId: id }]
  }
}

resource ordersInError 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = {
  name: '${namePrefix}-orders-in-error'
  location: location
  tags: tags
  properties: {
    description: 'An order reached Error (FailureThreshold exceeded or permanent failure): see the operator-alerts queue.'
    severity: 1
    enabled: true
    scopes: [
      applicationInsightsId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    criteria: {
      allOf: [
        {
          query: 'union (customMetrics | where name == "${ordersErrorMetric}" | project n = valueSum), (traces | where message startswith "${operatorAlertLogPrefix}" | project n = 1.0) | summarize errors = sum(n)'
          timeAggregation: 'Total'
          metricMeasureColumn: 'errors'
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    actions: {
      actionGroups: actions
    }
  }
}

resource supervisorSilent 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = {
  name: '${namePrefix}-supervisor-not-running'
  location: location
  tags: tags
  properties: {
    description: 'No Supervisor execution for ${supervisorSilenceMinutes} minutes: expired orders are not being recovered.'
    severity: 1
    enabled: true
    scopes: [
      applicationInsightsId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT${supervisorSilenceMinutes}M'
    criteria: {
      allOf: [
        {
          query: 'requests | where name == "${supervisorFunctionName}" or operation_Name == "${supervisorFunctionName}" | summarize runs = count()'
          timeAggregation: 'Total'
          metricMeasureColumn: 'runs'
          operator: 'LessThan'
          threshold: 1
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    actions: {
      actionGroups: actions
    }
  }
}

// One alert per remote service (dimension `service`, from the gauge's attribute) whose breaker was open at any point
// of the last 5 minutes, as any Agent replica reported it. The Agent reports the state every export interval while
// it runs, so the alert stays fired while the breaker is open and resolves by itself (autoMitigate, the default)
// once a 5-minute window has no 2: that is when the breaker closed (or went half-open and stayed there). The
// CircuitOpened / CircuitClosed operator alerts on the operator-alerts queue say the same thing as messages.
resource circuitOpen 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = {
  name: '${namePrefix}-circuit-open'
  location: location
  tags: tags
  properties: {
    description: 'A circuit breaker is open: the Agent is not calling that remote service and orders wait in Pending. Check the remote service; `python -m orderflow.breaker_cli show` shows the breaker.'
    severity: 1
    enabled: true
    scopes: [
      applicationInsightsId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    criteria: {
      allOf: [
        {
          query: 'customMetrics | where name == "${circuitStateMetric}" | extend service = tostring(customDimensions["service"]) | summarize state = max(valueMax) by service'
          timeAggregation: 'Maximum'
          metricMeasureColumn: 'state'
          dimensions: [
            {
              name: 'service'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          operator: 'GreaterThanOrEqual'
          threshold: circuitOpenState
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    actions: {
      actionGroups: actions
    }
  }
}
