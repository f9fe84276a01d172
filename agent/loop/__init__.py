"""The loop's own plumbing: the bounded inbox and the model-switch handshake."""
