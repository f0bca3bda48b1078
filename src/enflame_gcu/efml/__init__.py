"""The vendor's management library, libefml, through ``ctypes`` (no compiler on the node).

``types`` holds the return codes and struct layouts of efml.h (``../shared/EFML.md`` §1, §3);
``library`` finds, loads and initialises the library and wraps each call in a typed Python
function with base units; ``bounded`` runs each card's calls on a thread of its own so a hung
card cannot stall the others. Standard library only; no program is imported from here.
"""
