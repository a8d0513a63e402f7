"""Probes: the only code that talks to hardware and the OS through pynvml, psutil, netifaces, torch.

Each probe returns plain frozen dataclasses; checks only judge that data.
"""
