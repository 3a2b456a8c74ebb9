// Concern: the signals that mean an operator must act, as Azure Monitor alert rules, routed to an optional e-mail
// action group:
//  - dead-lettered messages above 0 on any queue (a poison message or an expired one: never silently dropped);
//  - orders in Error (the `orderflow.orders.error` custom metric or an operator-alert log line);
//  - the Supervisor not running (no `supervisor` execution for supervisorSilenceMinutes).
// The metric and log names are the telemetry contract with orderflow's OpenTelemetry instrumentation: every name an
// alert queries is one the code emits (tests/infra/test_infra_telemetry.py). There is no circuit-open alert yet:
// the Agent has no circuit breaker, so nothing emits a circuit metric; issue 11 adds both (docs/deploy.md).
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
