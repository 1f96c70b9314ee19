"""Flower's PyTorch quickstart on scikit-learn's 8×8 digits, with Basin's IMA on the server."""
