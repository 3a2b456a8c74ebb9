"""The Azure adapters: Cosmos DB (`cosmos`), the Service Bus clients on the app's identity (`servicebus`) and the
ARM queue runtime counts (`queue_counts`). `orderflow.adapters` picks them, or the stand-ins of
`orderflow.embedded`, from the app settings."""
