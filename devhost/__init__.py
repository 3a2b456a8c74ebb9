"""devhost: a local Azure Functions host that runs `function_app.py` unchanged, durably, with no Azure and no
Core Tools.

It plays the Functions host's part for the real SDKs: it indexes the app with `app.get_functions()`, is the Durable
Functions backend (history in SQLite, the Durable extension's HTTP API for the real client), and runs timer,
Service Bus (embedded broker or Azure) and HTTP triggers. See docs/devhost.md.
"""
