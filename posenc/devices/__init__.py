"""Devices, meshes and hosts: what every layer above may ask about where arrays live.

- :mod:`posenc.devices.sharding`: logical axis names -> mesh axes, the one table of rules.
- :mod:`posenc.devices.distributed`: several processes (hosts) and the run's mesh.
- :mod:`posenc.devices.fits`: whether a compiled computation fits in device memory.
"""
