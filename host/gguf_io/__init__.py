"""GGUF files on disk: is this one (magic), its content hash, its header metadata.

The one place that knows the GGUF container; what the header means for quantization
(host.quant.gguf_info) and for a run (host.quant.model_info) is read on top of it.
"""
