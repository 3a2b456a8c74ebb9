// Concern: the signals that mean an operator must act, as Azure Monitor alert rules, routed to an optional e-mail
// action group:
//  - dead-lettered messages above 0 on a system queue (agent-requests, agent-replies, operator-alerts: only the
//    product writes there, so a dead letter is a product fault), Sev-2;
//  - dead-lettered messages above badInputThreshold on a sender's queue (orders-inbound, each app's inbound and
//    status queue: poison input, or an app that does not read its statuses), Sev-3: a sender cannot page the on-call;
//  - orders that ended failed (the `orderflow.orders.error` custom metric or an operator-alert log line of an order
//    failure kind), Sev-1;
//  - bad input above a rate (operator-alert log lines of an input kind: poison messages, conflicting duplicates),
//    Sev-2: one sender of junk must not page the on-call;
//  - the Supervisor not running (no `supervisor` execution for supervisorSilenceMinutes);
//  - a circuit breaker open (issue 11): the gauge `orderflow.circuit.state` (0 closed, 1 half-open, 2 open; attribute
//    `service`) that the Agent reports (orderflow/telemetry.py) reads 2 for a remote service.
//  - alarms before anything is stuck (issue 26): the gauge `orderflow.alarm.firing` (1 firing, 0 quiet; attribute
//    `alarm`) that the function app reports every AlarmSchedule tick (orderflow/alarms.py) reads 1 for
//    oldest-pending (Sev-2), oldest-processing (Sev-2) or backlog-growth (Sev-3). The thresholds are the app's
//    settings, so the rules only ask whether the app says an alarm fires. Its dead-letters alarm needs no rule of its
//    own: the two dead-letter metric alerts above watch the same queues (SenderDeadLetterAlarmDepth = badInputThreshold).
// Every rule's description names its runbook step: `Runbook: README "Operating it", "<row>"`, a row of README's table
// of operator questions (tests/product/infra/test_infra_retention.py).
// The metric and log names are the telemetry contract with orderflow's OpenTelemetry instrumentation: every name an
// alert queries is one the code emits (tests/product/infra/test_infra_telemetry.py).
param location string
param tags object = {}
param namePrefix string
param serviceBusNamespaceId string
param applicationInsightsId string
@description('E-mail address that receives the alerts; empty for none (the alerts still fire in the portal).')
param alertEmail string = ''
@minValue(5)
param supervisorSilenceMinutes int = 15
@description('Bad-input operator alerts (poison messages, conflicting duplicates) per badInputWindowMinutes that raise the Sev-2 alert.')
@minValue(1)
param badInputThreshold int = 20
@minValue(5)
param badInputWindowMinutes int = 15
@description('Queues only the product writes to (agent-requests, agent-replies, operator-alerts).')
param systemQueueNames array
@description('Queues whose dead letters a sender causes: orders-inbound, every app\'s inbound queue and every status queue.')
param senderQueueNames array

var ordersErrorMetric = 'orderflow.orders.error'
// The start of the log line orderflow.outbound.raise_alert writes for every operator alert; the line carries the
// alert's kind (orderflow.messages.AlertKind) as the log attribute `alert_kind` (customDimensions in App Insights).
var operatorAlertLogPrefix = 'operator alert '
// Kinds that mean an order ended failed (orderflow.notifications: Error, or failed and compensated, or compensation
// failed) page the on-call; kinds a sender's bad input causes count towards the lower-severity rate alert.
// Each a KQL list of string literals.
var orderFailureKindList = '"FailureThresholdReached", "OrderFailed", "CompensationFailed"'
var inputKindList = '"PoisonMessage", "OrderConflict"'
var supervisorFunctionName = 'supervisor'
// The breaker's state gauge and the value that means open (orderflow.breaker: 0 closed, 1 half-open, 2 open).
var circuitStateMetric = 'orderflow.circuit.state'
var circuitOpenState = 2
// The alarms' gauge (orderflow/alarms.py): 1 while an alarm fires, 0 while it is quiet, per attribute `alarm`.
var alarmFiringMetric = 'orderflow.alarm.firing'
var oldestPendingAlarm = 'oldest-pending'
var oldestProcessingAlarm = 'oldest-processing'
var backlogGrowthAlarm = 'backlog-growth'
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
    description: 'A message was dead-lettered on a system queue (only the product writes there): inspect the dead-letter sub-queue and its reason. Runbook: README "Operating it", "A dead-letter queue grows".'
    severity: 2
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
              values: systemQueueNames
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

resource senderDeadLetters 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: '${namePrefix}-sender-dead-letters'
  location: 'global'
  tags: tags
  properties: {
    description: 'More than ${badInputThreshold} dead letters on a sender\'s queue (orders-inbound, an app\'s inbound queue, a status queue): poison input, or an app that does not read its statuses. Inspect the reasons (orderflow dlq list) and clear them. Runbook: README "Operating it", "A dead-letter queue grows".'
    severity: 3
    enabled: true
    scopes: [
      serviceBusNamespaceId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
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
              values: senderQueueNames
            }
          ]
          operator: 'GreaterThan'
          threshold: badInputThreshold
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
    description: 'An order ended failed (FailureThreshold exceeded, permanent failure, or compensation failed): see the operator-alerts queue. Runbook: README "Operating it", "Which orders failed, and why?".'
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
          query: 'union (customMetrics | where name == "${ordersErrorMetric}" | project n = valueSum), (traces | where message startswith "${operatorAlertLogPrefix}" | where tostring(customDimensions["alert_kind"]) in (${orderFailureKindList}) | project n = 1.0) | summarize errors = sum(n)'
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

// Bad input is the senders' to fix, and each message is already dead-lettered with its reason and answered on the
// sender's status queue when it names one: a few are no reason to wake anyone. Many in a window mean a sender is
// broken (or hostile): Sev-2, for working hours.
resource badInput 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = {
  name: '${namePrefix}-bad-input-rate'
  location: location
  tags: tags
  properties: {
    description: 'More than ${badInputThreshold} poison or conflicting messages in ${badInputWindowMinutes} minutes: a sender is sending bad input. See the dead-letter reasons and the operator-alerts queue. Runbook: README "Operating it", "What is in the dead-letter queue, and why?".'
    severity: 2
    enabled: true
    scopes: [
      applicationInsightsId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT${badInputWindowMinutes}M'
    criteria: {
      allOf: [
        {
          query: 'traces | where message startswith "${operatorAlertLogPrefix}" | where tostring(customDimensions["alert_kind"]) in (${inputKindList}) | summarize bad = count()'
          timeAggregation: 'Total'
          metricMeasureColumn: 'bad'
          operator: 'GreaterThan'
          threshold: badInputThreshold
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
    description: 'No Supervisor execution for ${supervisorSilenceMinutes} minutes: expired orders are not being recovered. Runbook: README "Operating it", "Is the Supervisor running, and what does a scan cost?".'
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
    description: 'A circuit breaker is open: the Agent is not calling that remote service and orders wait in Pending. Check the remote service; `python -m orderflow.cli.breaker show` shows the breaker. Runbook: README "Operating it", "Is the remote service down?".'
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

// Issue 26: alerts before stuck. The function app's alarm timer (AlarmSchedule, every minute) computes each alarm from
// the state store and its settings and reports it as the gauge orderflow.alarm.firing (1 firing, 0 quiet) with the
// attribute `alarm` (customDimensions["alarm"]). Each rule fires when its alarm read 1 at any point of the last 5
// minutes (the exporter sends every 60 s, so a window holds about five reports) and resolves by itself (autoMitigate,
// the default) after a 5-minute window without a 1. No report at all (the app down) is not an alarm here: the
// Supervisor's silence alert covers a stopped app. The gauge orderflow.orders.oldest_age (attribute `state`) and
// orderflow.backlog.growth carry the figures behind the alarms, for the workbook and an investigation.

// Orders wait to be started: the breaker is open, admission is full, or the Starter does not run.
resource oldestPending 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = {
  name: '${namePrefix}-oldest-pending'
  location: location
  tags: tags
  properties: {
    description: 'The oldest Pending order has waited longer than the app allows (its oldest-pending alarm, orderflow.orders.oldest_age for Pending): orders are admitted but not started. Runbook: README "Operating it", "Orders wait too long in Pending".'
    severity: 2
    enabled: true
    scopes: [
      applicationInsightsId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    criteria: {
      allOf: [
        {
          query: 'customMetrics | where name == "${alarmFiringMetric}" | where tostring(customDimensions["alarm"]) == "${oldestPendingAlarm}" | summarize firing = max(valueMax)'
          timeAggregation: 'Maximum'
          metricMeasureColumn: 'firing'
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

// Attempts that neither finish nor get recovered: the Agent or the remote service is slow, or recovery is behind.
resource oldestProcessing 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = {
  name: '${namePrefix}-oldest-processing'
  location: location
  tags: tags
  properties: {
    description: 'The oldest Processing order has been in progress longer than the app allows (its oldest-processing alarm, orderflow.orders.oldest_age for Processing): attempts are not finishing or not being recovered. Runbook: README "Operating it", "Orders stay too long in Processing".'
    severity: 2
    enabled: true
    scopes: [
      applicationInsightsId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    criteria: {
      allOf: [
        {
          query: 'customMetrics | where name == "${alarmFiringMetric}" | where tostring(customDimensions["alarm"]) == "${oldestProcessingAlarm}" | summarize firing = max(valueMax)'
          timeAggregation: 'Maximum'
          metricMeasureColumn: 'firing'
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

// The backlog grows faster than it drains: a load to watch, not yet a fault, so Sev-3.
resource backlogGrowth 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = {
  name: '${namePrefix}-backlog-growth'
  location: location
  tags: tags
  properties: {
    description: 'The Pending backlog grew by more than BacklogGrowthAlarmOrders over BacklogGrowthWindowSeconds (the backlog-growth alarm, orderflow.backlog.growth): orders arrive faster than they are processed. Runbook: README "Operating it", "The backlog grows faster than it drains".'
    severity: 3
    enabled: true
    scopes: [
      applicationInsightsId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    criteria: {
      allOf: [
        {
          query: 'customMetrics | where name == "${alarmFiringMetric}" | where tostring(customDimensions["alarm"]) == "${backlogGrowthAlarm}" | summarize firing = max(valueMax)'
          timeAggregation: 'Maximum'
          metricMeasureColumn: 'firing'
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
