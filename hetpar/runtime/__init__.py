"""PyTorch execution of hetpar plans (the only part of hetpar that imports torch, lazily)."""
