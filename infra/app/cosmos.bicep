// Concern: Cosmos DB for the orders (immutable) and the state store (ProcessState, LockedBy, CompleteBy,
// FailureCount), with indexes that serve the Starter's and the Supervisor's queries, plus the circuit-breaker
// documents the Agent instances share (issue 11) and the Supervisor's recovery index (issue 12). Entra ID only
// (disableLocalAuth); data-plane grants are in rbac.bicep. Containers are created here, never by the app
// (disableKeyBasedMetadataWriteAccess), so the app needs data access only.
param location string
param tags object = {}
param accountName string
@allowed([
  'serverless'
  'autoscale'
])
param capacityMode string = 'serverless'
@description('Autoscale maximum RU/s per database (autoscale mode only).')
@minValue(1000)
param autoscaleMaxThroughput int = 1000
param ordersDatabaseName string
param ordersContainerName string
param stateDatabaseName string
param stateContainerName string
param checkpointContainerName string
@description('Container of the circuit-breaker documents (CircuitBreakerContainerName), in the state database.')
param circuitBreakerContainerName string
@description('Container of the recovery index (RecoveryIndexContainerName), in the state database, partition key /bucket.')
param recoveryIndexContainerName string
param logAnalyticsWorkspaceId string
@description('Private posture (main.bicep vnetEnabled): no public network access; reached through a private endpoint (Sql).')
param vnetEnabled bool = false
@description('Continuous backup tier (point-in-time restore window): Continuous7Days (no backup storage charge) or Continuous30Days.')
@allowed([
  'Continuous7Days'
  'Continuous30Days'
])
param backupTier string = 'Continuous7Days'

// Issue 26: the orders and the state records expire only when the app says so. A container's defaultTtl of -1 turns
// Time to Live on with no default expiry: an item without its own `ttl` never expires, an item with `ttl` = n expires
// n seconds after its last write. A per-item `ttl` is honoured only when the container's DefaultTimeToLive is set
// (-1 or n); with it missing (null) every item's `ttl` is ignored. ("Time to Live on an item ... is applicable only
// if DefaultTimeToLive is present and it isn't set to null for the parent container"; "If TTL on a container is set
// to -1, an item in this container that has the time to live set to n, will expire after n seconds, and remaining
// items won't expire": Time to Live in Azure Cosmos DB, https://learn.microsoft.com/azure/cosmos-db/nosql/time-to-live)
// The app writes `ttl` (FinishedOrderRetentionSeconds) on a finished order's state record and stored order once its
// terminal status went out, and never on an unfinished one, so nothing unfinished can expire; `orderflow keep` sets
// -1 on one order. Changing defaultTtl on an existing container is an in-place update; the items already there carry
// no `ttl` and so never expire.
var ttlOnWithoutDefaultExpiry = -1

// Time to live of a recovery index entry: 604800 s = 7 days after its last write (the container's defaultTtl; see
// recoveryIndexContainer).
var recoveryIndexTtlSeconds = 604800

var databaseOptions = capacityMode == 'autoscale' ? { autoscaleSettings: { maxThroughput: autoscaleMaxThroughput } } : {}

resource account 'Microsoft.DocumentDB/databaseAccounts@2024-05-15' = {
  name: accountName
  location: location
  tags: tags
  kind: 'GlobalDocumentDB'
  properties: {
    databaseAccountOfferType: 'Standard'
    disableLocalAuth: true
    disableKeyBasedMetadataWriteAccess: true
    minimalTlsVersion: 'Tls12'
    publicNetworkAccess: vnetEnabled ? 'Disabled' : 'Enabled'
    // Session consistency: a writer reads its own etag-guarded writes, which the fenced updates rely on.
    consistencyPolicy: {
      defaultConsistencyLevel: 'Session'
    }
    locations: [
      {
        locationName: location
        failoverPriority: 0
        isZoneRedundant: false
      }
    ]
    capabilities: capacityMode == 'serverless' ? [ { name: 'EnableServerless' } ] : []
    // Continuous backup (point-in-time restore to a new account, docs/deploy.md "Retention and backup"): every
    // write is backed up within about 100 s, restorable to any second of the tier's window. Continuous7Days has no
    // backup storage charge, Continuous30Days does; a restore is charged per GB in either. An existing account on
    // the default periodic mode migrates on the next deployment, one way (it cannot go back to periodic).
    // Schema: ContinuousModeBackupPolicy { type: 'Continuous', continuousModeProperties: { tier } } in
    // Microsoft.DocumentDB/databaseAccounts@2024-05-15 (Azure/bicep-types-az generated/cosmos-db/microsoft.documentdb/
    // 2024-05-15/types.md: BackupPolicy, ContinuousModeProperties.tier 'Continuous30Days' | 'Continuous7Days');
    // https://learn.microsoft.com/azure/cosmos-db/continuous-backup-restore-introduction and
    // https://learn.microsoft.com/azure/cosmos-db/migrate-continuous-backup (the ARM template form).
    backupPolicy: {
      type: 'Continuous'
      continuousModeProperties: {
        tier: backupTier
      }
    }
  }
}

resource ordersDatabase 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases@2024-05-15' = {
  parent: account
  name: ordersDatabaseName
  properties: {
    resource: {
      id: ordersDatabaseName
    }
    options: databaseOptions
  }
}

// Orders are written once and read by id (point reads): index only what an operator filters on.
resource ordersContainer 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers@2024-05-15' = {
  parent: ordersDatabase
  name: ordersContainerName
  properties: {
    resource: {
      id: ordersContainerName
      partitionKey: {
        paths: [
          '/orderId'
        ]
        kind: 'Hash'
        version: 2
      }
      // TTL on, no default expiry: a stored order expires only with the `ttl` the app sets once it finished.
      defaultTtl: ttlOnWithoutDefaultExpiry
      // The code reads this container by id only (orderflow/azure/cosmos.py CosmosOrdersDb: create, point
      // read); the partition key is the one path worth an index entry.
      indexingPolicy: {
        indexingMode: 'consistent'
        automatic: true
        includedPaths: [
          { path: '/orderId/?' }
        ]
        excludedPaths: [
          { path: '/*' }
        ]
      }
    }
  }
}

resource stateDatabase 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases@2024-05-15' = {
  parent: account
  name: stateDatabaseName
  properties: {
    resource: {
      id: stateDatabaseName
    }
    options: databaseOptions
  }
}

// The state store. The Starter runs `processState = 'Pending' AND IS_NULL(lockedBy) AND retryAt <= now ORDER BY
// retryAt, createdAt` (a multi-field ORDER BY needs exactly that composite index); the Supervisor pages with a
// keyset: `processState = 'Processing' AND completeBy in [from, to) AND (completeBy, id) > cursor ORDER BY
// completeBy, id` (composite (completeBy, id)). The (processState, ...) composite
// indexes serve the equality filter plus range/order of each query, so both stay bounded index seeks.
// orderflow/azure/cosmos.py STATE_INDEXING_POLICY is the code's side of this contract (checked by tests).
resource stateContainer 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers@2024-05-15' = {
  parent: stateDatabase
  name: stateContainerName
  properties: {
    resource: {
      id: stateContainerName
      partitionKey: {
        paths: [
          '/orderId'
        ]
        kind: 'Hash'
        version: 2
      }
      // TTL on, no default expiry: a state record expires only with the `ttl` the app sets once it finished.
      defaultTtl: ttlOnWithoutDefaultExpiry
      indexingPolicy: {
        indexingMode: 'consistent'
        automatic: true
        includedPaths: [
          { path: '/*' }
        ]
        excludedPaths: [
          { path: '/"_etag"/?' }
        ]
        compositeIndexes: [
          [
            { path: '/retryAt', order: 'ascending' }
            { path: '/createdAt', order: 'ascending' }
          ]
          [
            { path: '/processState', order: 'ascending' }
            { path: '/retryAt', order: 'ascending' }
            { path: '/createdAt', order: 'ascending' }
          ]
          [
            { path: '/completeBy', order: 'ascending' }
            { path: '/id', order: 'ascending' }
          ]
          [
            { path: '/processState', order: 'ascending' }
            { path: '/completeBy', order: 'ascending' }
          ]
          [
            { path: '/processState', order: 'ascending' }
            { path: '/retryAt', order: 'ascending' }
          ]
          // The operator tools' listing (`orderflow orders`, GET /api/orders: query_in_state) and the summary's
          // oldest Pending: ORDER BY c.processState, c.updatedAt, c.id (a multi-field ORDER BY needs its composite).
          [
            { path: '/processState', order: 'ascending' }
            { path: '/updatedAt', order: 'ascending' }
            { path: '/id', order: 'ascending' }
          ]
        ]
      }
    }
  }
}

// The Supervisor's scan checkpoint: one small document per scanner (id = scanner name), read and replaced with its
// etag. It is not per order, so its partition key is its id. No change feed is used: no lease container exists.
resource checkpointContainer 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers@2024-05-15' = {
  parent: stateDatabase
  name: checkpointContainerName
  properties: {
    resource: {
      id: checkpointContainerName
      partitionKey: {
        paths: [
          '/id'
        ]
        kind: 'Hash'
        version: 2
      }
    }
  }
}

// The circuit breakers (orderflow/breaker.py): one small document per remote service (id = RemoteServiceName), read
// by id and replaced with its etag (If-Match) by every Agent instance, read by the Starter, written by the operator
// command. Not per order, so its partition key is its id, like the checkpoints. It is the only container the Agent's
// identity can reach, through the custom role in rbac.bicep (read, create, replace items; nothing else); the function
// app reaches it through its Data Contributor grant on the state database.
resource circuitBreakerContainer 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers@2024-05-15' = {
  parent: stateDatabase
  name: circuitBreakerContainerName
  properties: {
    resource: {
      id: circuitBreakerContainerName
      partitionKey: {
        paths: [
          '/id'
        ]
        kind: 'Hash'
        version: 2
      }
    }
  }
}

// The recovery index (issue 12; the Supervisor's SupervisorScanMode=index): one small entry per CompleteBy written, id
// '<orderId>|<completeBy>', partition key /bucket = the start of its CompleteBy time bucket (RecoveryIndexBucketSeconds
// wide), so the Supervisor reads expired work bucket by bucket with single-partition queries instead of a
// cross-partition CompleteBy query on the state container. The state record stays the truth: an entry may be stale
// and the Supervisor verifies each hit against the record, deleting stale and recovered entries. The function app
// reaches it through its Data Contributor grant on the state database; the Agent cannot (rbac.bicep).
//
// defaultTtl: an entry expires 7 days after its last write, so entries nobody deleted (stale ones, a crash between
// the index write and the state write) do not pile up. A container defaultTtl of n (no per-item ttl) expires each
// item n seconds after its last modification; an expired item leaves query results at once and is deleted in the
// background (on serverless, charged like a delete). Rewriting an entry restarts its clock.
// (Time to Live in Azure Cosmos DB, https://learn.microsoft.com/azure/cosmos-db/nosql/time-to-live)
//
// The Supervisor pages a bucket with `ORDER BY c.completeBy, c.orderId` (keyset on (completeBy, orderId)). A query
// whose ORDER BY has two or more properties needs a composite index in exactly that order (or its exact reverse), in
// a single partition too; without it the query fails rather than scanning. orderflow/azure/cosmos.py
// INDEX_INDEXING_POLICY is the code's side of this contract (checked by tests). ("Queries that have an ORDER BY clause with two or
// more properties require a composite index", Azure Cosmos DB indexing policies, composite indexes,
// https://learn.microsoft.com/azure/cosmos-db/index-policy#composite-indexes)
resource recoveryIndexContainer 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers@2024-05-15' = {
  parent: stateDatabase
  name: recoveryIndexContainerName
  properties: {
    resource: {
      id: recoveryIndexContainerName
      partitionKey: {
        paths: [
          '/bucket'
        ]
        kind: 'Hash'
        version: 2
      }
      defaultTtl: recoveryIndexTtlSeconds
      indexingPolicy: {
        indexingMode: 'consistent'
        automatic: true
        includedPaths: [
          { path: '/*' }
        ]
        excludedPaths: [
          { path: '/"_etag"/?' }
        ]
        compositeIndexes: [
          [
            { path: '/completeBy', order: 'ascending' }
            { path: '/orderId', order: 'ascending' }
          ]
        ]
      }
    }
  }
}

resource diagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: account
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    logAnalyticsDestinationType: 'Dedicated'
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
    metrics: [
      {
        category: 'Requests'
        enabled: true
      }
    ]
  }
}

output accountId string = account.id
output accountName string = account.name
output endpoint string = account.properties.documentEndpoint
