"""The step loop and what it drives: scheduler, sequences and requests, model runner, sampling, outputs."""
