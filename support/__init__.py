"""What the scripts at the root stand on, and a reader does not need first: the command line and checkpoints
(runtime), the training loop (training), the language-model and translation data (data, mt_data), Hugging Face
GPT-2 (hf), and what the two trainers share around the loop (job)."""
