"""The MQTT link: the session of the node, the ring of servers, packets bounded at the socket."""
