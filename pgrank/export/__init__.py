"""``pgrank export``: a trained policy as a plain sentence-transformers folder with a model card, and its upload
to the Hugging Face hub."""
