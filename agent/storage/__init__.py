"""The storage edge: the journal (SQLite), its transactions, the step marker."""
