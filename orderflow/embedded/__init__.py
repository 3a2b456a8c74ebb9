"""Azure's stand-ins for local runs: the embedded Service Bus broker (`broker`, SQLite, safe across processes), its
clients with the azure-servicebus surface (`client`, `client_aio`; `config` reads the queue declarations, `notify`
wakes waiting receivers across processes) and the embedded store with Cosmos-like etags (`store`). They are in the
core's reach because the Agent and the CLI use them without devhost; `orderflow.adapters` picks them from the app
settings."""
