"""The parts t2r.py stands on, beneath it (they import nothing of the models): the paper's input embedding with its
sinusoidal positions (embedding), adaptive input and softmax (adaptive), the one-line errors of a config that
cannot be built (config_rules), and the recurrent states' bookkeeping: float32 sums, the KV cache's growth, a
prefill's pieces, a state's bytes (states)."""
