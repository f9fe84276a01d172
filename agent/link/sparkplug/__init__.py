"""The Sparkplug B session of the edge node."""
