"""The parts t2r.py stands on, beneath it (they import nothing of the models): the paper's input embedding with its
sinusoidal positions (embedding), adaptive input and softmax (adaptive), and the recurrent states' bookkeeping:
float32 sums, the KV cache's growth, a state's bytes (states)."""
