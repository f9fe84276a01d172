"""Model tiers: building quantized variants of a voice and judging them against its FP32 output
(`python -m tiers.quantize`). Apart from the operator's tool (`ota`), which never loads ONNX
Runtime."""
