"""What outlives a run: host-state checkpoints for resume and the Hugging Face export."""
