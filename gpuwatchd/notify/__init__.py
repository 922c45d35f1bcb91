"""Alert delivery: dispatcher with Alertmanager semantics, durable SQLite outbox, one module per integration."""
