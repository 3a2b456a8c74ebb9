"""A Durable Functions app in the shape of Microsoft's Python quickstart (v2 model), written here: an HTTP starter
with a durable client, an orchestrator that chains one activity three times, and the activity. Its host.json, as
`func init` writes it but without the `extensionBundle` section, is what devhost must refuse."""

import azure.durable_functions as df
import azure.functions as func

app = df.DFApp(http_auth_level=func.AuthLevel.ANONYMOUS)


@app.route(route="orchestrators/{functionName}")
@app.durable_client_input(client_name="client")
async def http_start(req: func.HttpRequest, client) -> func.HttpResponse:
    instance_id = await client.start_new(req.route_params["functionName"])
    return client.create_check_status_response(req, instance_id)


@app.orchestration_trigger(context_name="context")
def greetings(context: df.DurableOrchestrationContext):
    places = []
    for place in ("Lisbon", "Osaka", "Quito"):
        places.append((yield context.call_activity("greet", place)))
    return places


@app.activity_trigger(input_name="place")
def greet(place: str) -> str:
    return f"Hello from {place}"
