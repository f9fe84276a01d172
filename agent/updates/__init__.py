"""The update edge: the worker, the slots and their files, the model a start begins with."""
