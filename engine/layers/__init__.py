"""Building blocks shared by the model families: norms, rotary embeddings, CPU linear layers."""
