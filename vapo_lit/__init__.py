"""vapo-lit: run and ablate VAPO-style value-based PPO for LLM reasoning with Lightning."""

__version__ = "0.1.0"
