"""hetpar: plan, simulate and run hybrid-parallel LLM training on heterogeneous clusters."""

__version__ = "0.1.0"
