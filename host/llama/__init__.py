"""llama.cpp on this machine: where the bindings and their native tools live, how they were built.

The one place that knows the layout scripts/build_llama.sh installs; quantize, the runner, the
accuracy cross-check, the RPC workers and the doctor all find llama.cpp through it.
"""
