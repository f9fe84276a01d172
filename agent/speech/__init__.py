"""The speech edge: Piper voices on ONNX Runtime, the split decoder, the synthesis thread, the
phrase cache, chimes and the sounds a request plays (fetched, decoded in a child)."""
