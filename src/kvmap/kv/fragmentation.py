"""Internal fragmentation of a paged KV pool: allocated slots that hold no token.

A sequence holding ``b`` blocks of ``block_size`` slots and ``n`` tokens wastes
``b * block_size - n`` slots, all in its last, partly filled block (and in any block the
scheduler allocated ahead of the tokens). Shared prefix blocks are full, so they waste
nothing and are counted once by their holders' lengths. Pure: the engine side only
hands in ``(num_blocks, num_slots)`` per running sequence (``kvmap.bench.timeseries``).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Waste:
    """What the partly filled blocks cost at one instant."""

    waste_slots: int
    waste_bytes: int
    resident_bytes: int          # bytes of the blocks the sequences hold

    @property
    def share(self) -> float:
        """Waste as a share of resident KV (0 with nothing resident)."""
        return self.waste_bytes / self.resident_bytes if self.resident_bytes else 0.0


def internal_waste(sequences: list[tuple[int, int]], block_size: int,
                   bytes_per_block: int) -> Waste:
    """Waste of ``sequences`` (``(num_blocks, num_slots)`` each) in a pool of
    ``block_size``-slot blocks of ``bytes_per_block`` bytes (all layers)."""
    if block_size < 1:
        raise ValueError(f"block_size={block_size!r} must be >= 1")
    slots = blocks = 0
    for num_blocks, num_slots in sequences:
        if not 0 <= num_slots <= num_blocks * block_size:
            raise ValueError(f"a sequence holds {num_slots} slots in {num_blocks} blocks "
                             f"of {block_size}: must be in [0, {num_blocks * block_size}]")
        slots += num_blocks * block_size - num_slots
        blocks += num_blocks
    return Waste(waste_slots=slots, waste_bytes=slots * bytes_per_block // block_size,
                 resident_bytes=blocks * bytes_per_block)
