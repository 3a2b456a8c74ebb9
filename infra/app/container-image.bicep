// Concern: the image a container app runs now, so that a re-provision keeps the image `azd deploy` put there
// instead of putting the placeholder back. This is azd's "exists" pattern: before provisioning, azd sets
// SERVICE_<NAME>_RESOURCE_EXISTS for each containerapp service (azure-dev cli/azd/pkg/project/
// service_target_containerapp.go, addPreProvisionChecks), main.parameters.json passes it as a bool, and the lookup
// runs in its own module (azure-dev cli/azd/resources/scaffold/base/modules/fetch-container-image.bicep), a nested
// deployment that reads the app before the caller's deployment changes it.
@description('Whether the container app exists already (azd: SERVICE_<NAME>_RESOURCE_EXISTS).')
param exists bool
param containerAppName string
@description('The image of a new app.')
param placeholderImage string

resource existingApp 'Microsoft.App/containerApps@2025-01-01' existing = if (exists) {
  name: containerAppName
}

output image string = exists ? existingApp!.properties.template.containers[0].image : placeholderImage
