"""The scaffolding above the models, which a reader does not need first: the command line and files (runtime),
checkpoints (checkpoints), the training loop (training) and a run's folder (run_files), what the two trainers share
around the loop (job), which model a saved config describes (configs), the language-model and translation data (data,
mt_data), Hugging Face GPT-2 and Llama-family checkpoints (hf)."""
