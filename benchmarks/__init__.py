"""Tasks (training data + rewards), benchmarks (eval loaders + graders), pass@k and the code sandbox."""
