"""Collectives and the links they run on: a profile's links and their prices (links, and
between simulated CPU devices: cpulinks), when a collective can hide under compute (overlap),
and a step's communication time (commtime)."""
