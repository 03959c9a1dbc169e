"""Model I/O: resolve a model name (hub id, local folder, the embedded GGUF, the tiny test
models), load it with its tokenizer, and write a model card. Imports no other room of the
engine; every room may import it."""
