"""The sounder: the node's lean process that owns the speaker and the alarm lane."""
