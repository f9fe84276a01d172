"""The pure core: the scheduler's decisions, the events and actions it exchanges, what a
node can play, what one request plays, the egress policy. No I/O, no clock, no threads."""
