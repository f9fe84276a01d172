"""The system edge: systemd, the allocator, the board, the system clock."""
