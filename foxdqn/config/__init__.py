"""The configuration: the typed schema and its checks (schema.py), composition through Hydra (compose.py)
and the key tables of docs/configuration.md (doc.py)."""
