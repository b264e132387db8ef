"""Dataset commands: `darkpy anchors` and `darkpy labels from-coco|from-voc`; `cli.py` adds them with
`register(main)`. The library is anchors.py and convert.py."""
from __future__ import annotations

import click

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def register(group: click.Group) -> None:
    pass
