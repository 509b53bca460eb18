"""Bridges from arl's games, agents and algorithms to other training frameworks (optional extras).

Nothing in arl imports this package; each subpackage imports its framework on first use.
"""
