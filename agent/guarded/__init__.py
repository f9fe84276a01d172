"""I/O helpers with the trust controls built in (any edge may use them; they own no outside
thing): HTTP downloads within the egress policy, files opened without following links."""
