"""The `nano-infer` command: `generate` and `serve`."""
