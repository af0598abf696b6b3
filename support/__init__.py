"""What the scripts at the root stand on, and a reader does not need first: the command line and checkpoints
(runtime), the training loop (training) and a run's folder (run_files), what the two trainers share around the loop
(job), Config's checks (configs), the input embedding and its positions (embedding), the KV cache's growth and a
state's bytes (states), adaptive input and softmax (adaptive), the Llama family's layers (llama_layers), the
language-model and translation data (data, mt_data), Hugging Face GPT-2 and Llama-family checkpoints (hf)."""
