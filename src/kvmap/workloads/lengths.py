"""Token-length distributions for prompts and outputs.

Each distribution is a frozen dataclass whose one job is ``_draw`` (floats); the base class
rounds, clips to ``[1, max_tokens]`` and validates. ``sample(rng, n)`` returns an
``np.ndarray`` of ``n`` int64 token counts and advances ``rng`` (a ``np.random.Generator``).

ShareGPT shape. The lognormal presets take their means from the lengths commonly reported
for vLLM's filtered ShareGPT sample (about 230 prompt and 200 output tokens per turn).
No published standard deviation was found, so ``SHAREGPT_SIGMA = 1.0`` is a judgement,
not a fit: it gives a median of ``mean * exp(-0.5) ~ 0.61 * mean`` and a p99 of about
6.3x the median (``exp(2.326)``), i.e. the long right tail that ShareGPT histograms show
(most turns short, a few of 1-2K tokens). Override it where you have real data.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

SHAREGPT_PROMPT_MEAN_TOKENS = 230
SHAREGPT_OUTPUT_MEAN_TOKENS = 200
SHAREGPT_SIGMA = 1.0
DEFAULT_MAX_TOKENS = 4096


def _check_positive_int(name: str, value: object) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} must be an integer >= 1")


@dataclass(frozen=True)
class LengthDist:
    """Base: sample token counts in ``[1, max_tokens]``."""

    max_tokens: int = field(default=DEFAULT_MAX_TOKENS, kw_only=True)

    def __post_init__(self) -> None:
        _check_positive_int("max_tokens", self.max_tokens)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` token counts, int64, each in ``[1, max_tokens]``."""
        if not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n={n!r} must be an integer >= 0")
        draws = np.rint(np.asarray(self._draw(rng, int(n)), dtype=np.float64))
        return np.clip(draws, 1, self.max_tokens).astype(np.int64)

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raise NotImplementedError

    @property
    def mean_tokens(self) -> float:
        """The mean before clipping."""
        raise NotImplementedError

    def with_mean(self, mean_tokens: int) -> LengthDist:
        """The same shape moved to a new mean (used by ``--quick`` and size overrides)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Fixed(LengthDist):
    """Always ``num_tokens``."""

    num_tokens: int

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive_int("num_tokens", self.num_tokens)
        if self.num_tokens > self.max_tokens:
            raise ValueError(f"num_tokens={self.num_tokens} exceeds max_tokens={self.max_tokens}")

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.num_tokens)

    @property
    def mean_tokens(self) -> float:
        return float(self.num_tokens)

    def with_mean(self, mean_tokens: int) -> LengthDist:
        return replace(self, num_tokens=int(mean_tokens),
                       max_tokens=max(self.max_tokens, int(mean_tokens)))


@dataclass(frozen=True)
class Uniform(LengthDist):
    """Integers uniform on ``[lo_tokens, hi_tokens]``, both ends included."""

    lo_tokens: int
    hi_tokens: int

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive_int("lo_tokens", self.lo_tokens)
        _check_positive_int("hi_tokens", self.hi_tokens)
        if self.hi_tokens < self.lo_tokens:
            raise ValueError(f"hi_tokens={self.hi_tokens} < lo_tokens={self.lo_tokens}")
        if self.hi_tokens > self.max_tokens:
            raise ValueError(f"hi_tokens={self.hi_tokens} exceeds max_tokens={self.max_tokens}")

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.lo_tokens, self.hi_tokens + 1, size=n)

    @property
    def mean_tokens(self) -> float:
        return (self.lo_tokens + self.hi_tokens) / 2

    def with_mean(self, mean_tokens: int) -> LengthDist:
        # Keep the relative width: Uniform(192, 320).with_mean(64) -> Uniform(48, 80).
        scale = mean_tokens / self.mean_tokens
        lo = max(1, round(self.lo_tokens * scale))
        hi = max(lo, round(self.hi_tokens * scale))
        return replace(self, lo_tokens=lo, hi_tokens=hi, max_tokens=max(self.max_tokens, hi))


@dataclass(frozen=True)
class LogNormal(LengthDist):
    """Lognormal with the given arithmetic mean: ``mu = ln(mean) - sigma**2 / 2``."""

    mean: float
    sigma: float = SHAREGPT_SIGMA

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.mean, (int, float)) or not math.isfinite(self.mean) \
                or self.mean < 1:
            raise ValueError(f"mean={self.mean!r} must be a finite number >= 1")
        if not isinstance(self.sigma, (int, float)) or not 0 <= self.sigma <= 5:
            raise ValueError(f"sigma={self.sigma!r} must be in [0, 5]")

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        mu = math.log(self.mean) - self.sigma ** 2 / 2
        return rng.lognormal(mu, self.sigma, size=n)

    @property
    def mean_tokens(self) -> float:
        return float(self.mean)

    def with_mean(self, mean_tokens: int) -> LengthDist:
        return replace(self, mean=float(mean_tokens))


def sharegpt_prompt(max_tokens: int = DEFAULT_MAX_TOKENS) -> LogNormal:
    """ShareGPT-like prompt lengths (see the module docstring for the sigma)."""
    return LogNormal(SHAREGPT_PROMPT_MEAN_TOKENS, max_tokens=max_tokens)


def sharegpt_output(max_tokens: int = DEFAULT_MAX_TOKENS) -> LogNormal:
    """ShareGPT-like output lengths (see the module docstring for the sigma)."""
    return LogNormal(SHAREGPT_OUTPUT_MEAN_TOKENS, max_tokens=max_tokens)


def parse_length(text: str, max_tokens: int = DEFAULT_MAX_TOKENS) -> LengthDist:
    """``"256"``/``"fixed:256"``, ``"uniform:128:384"``, ``"lognormal:230[:1.0]"``.

    ``max_tokens`` clips lognormal draws; fixed and uniform lengths raise it to fit.
    """
    kind, *args = str(text).strip().lower().split(":")
    if kind.isdigit() and not args:
        kind, args = "fixed", [kind]
    try:
        if kind == "fixed" and len(args) == 1:
            num_tokens = int(args[0])
            return Fixed(num_tokens, max_tokens=max(max_tokens, num_tokens))
        if kind == "uniform" and len(args) == 2:
            lo, hi = int(args[0]), int(args[1])
            return Uniform(lo, hi, max_tokens=max(max_tokens, hi))
        if kind == "lognormal" and len(args) in (1, 2):
            return LogNormal(*map(float, args), max_tokens=max_tokens)
    except ValueError as e:
        raise ValueError(f"length distribution {text!r}: {e}") from None
    raise ValueError(f"length distribution {text!r} is not one of: N, fixed:N, "
                     "uniform:LO:HI, lognormal:MEAN[:SIGMA]")
