"""The MQTT edge: the paho client and its session."""
