"""Functions entry points fed by the outside world: Service Bus and timer triggers (thin: logic is in orderflow)."""
