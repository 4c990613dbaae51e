"""Model loading and the decoders; importing the package registers every decoder in
``kvmap.model.decoders.DECODERS``."""
from kvmap.model import gemma3, llama  # noqa: F401  (fills DECODERS)
