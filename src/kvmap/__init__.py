"""kvmap: full-scenario KV-cache evaluation and optimization for LLM inference."""
from kvmap.request import RequestOutput, SamplingParams

__version__ = "0.1.0"


def __getattr__(name):
    if name == "LLM":          # imports torch and the engine only when used
        from kvmap.engine.llm import LLM
        return LLM
    raise AttributeError(name)


__all__ = ["LLM", "SamplingParams", "RequestOutput", "__version__"]
