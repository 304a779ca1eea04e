"""Text in and out: byte-level BPE tables, chat templates, incremental detokenization."""
