"""Command-line tools on a trained model: ``vit-predict``, ``vit-export``, ``vit-attention-maps``; ``common``
holds what they share (loading a model and images, checking paths and devices)."""
