"""Checks of an explicit topology's devices, switches and links (``devices:``, ``switches:``, ``links:`` of a
hardware file), run as the hardware file is validated, each refusing at the entry's line."""

from __future__ import annotations

import re

from simtrain.spec.schema import FieldError

#: the cluster graph calls the i-th GPU of an explicit topology gpu{i} (simtrain.spec.topology); a switch of that
#: name would merge with the GPU, and a device of that name at another position would mean another GPU
_GPU_NODE = re.compile(r"gpu(\d+)")


def all_joined(devices: list, links: list) -> None:
    """Every device of an explicit topology reaches the first one over its links (each carries traffic both ways):
    refuse the first that does not, at its line, before any route is asked for."""
    root: dict[str, str] = {}
    size: dict[str, int] = {}

    def find(name: str) -> str:
        while root.get(name, name) != name:
            root[name] = root.get(root[name], root[name])      # path halving: near-constant time per call
            name = root[name]
        return name

    for link in links:
        a, b = find(link.a), find(link.b)
        if a != b:
            if size.get(a, 1) > size.get(b, 1):
                a, b = b, a
            root[a] = b                                         # the smaller tree under the larger
            size[b] = size.get(b, 1) + size.get(a, 1)
    first = find(devices[0].name)
    for i, device in enumerate(devices):
        if find(device.name) != first:
            raise FieldError(f"'{device.name}' has no path to '{devices[0].name}' over the links (the devices must "
                             "form one network: link it, or its switch, to the others)", "devices", i, "name")


def not_an_internal_name(name: str, section: str, index: int) -> None:
    """Refuse a user's name that the cluster graph uses for another GPU, at its line."""
    m = _GPU_NODE.fullmatch(name)
    if m is None or (section == "devices" and m.group(1) == str(index)):
        return
    if section == "switches":
        raise FieldError(f"'{name}' is the cluster graph's name of GPU {m.group(1)} (devices are gpu0, gpu1, ... "
                         "in list order): name the switch otherwise, e.g. 'sw0'", section, index, "name")
    raise FieldError(f"'{name}' is the cluster graph's name of GPU {m.group(1)}, but this is device {index} "
                     f"(gpu{index}): name devices after their position or otherwise, e.g. 'dev{index}'",
                     section, index, "name")
