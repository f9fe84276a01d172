"""The wire, pure: topic names, payload parsing and encoding, the route table, Hermes, Home
Assistant discovery, the state JSON, update manifests. No I/O, no clock, no threads."""
