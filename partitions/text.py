"""Next-character text as tensors (LEAF's Shakespeare): each snippet's characters as ids in
a fixed vocabulary (0: padding, 1: a character outside it), cut or padded to a fixed
length, and as targets the id of the character after each position; padded positions
are not scored (``IGNORE_INDEX``)."""

from __future__ import annotations

import numpy as np

PAD_ID, OOV_ID = 0, 1
# Targets with this value are not scored (PyTorch's cross-entropy default): padding.
IGNORE_INDEX = -100
# LEAF's Shakespeare characters (utils/language_utils.py ALL_LETTERS); id = position + 2.
VOCABULARY = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
SEQUENCE_LENGTH = 80


def encode_text(snippets, next_characters) -> tuple[np.ndarray, np.ndarray]:
    """Character ids of each snippet (padded/cut to :data:`SEQUENCE_LENGTH`) and the ids of
    the character after each position (``x[1:] + y``; padding: :data:`IGNORE_INDEX`)."""
    lookup = {c: i + 2 for i, c in enumerate(VOCABULARY)}
    inputs = np.full((len(snippets), SEQUENCE_LENGTH), PAD_ID, dtype=np.int64)
    targets = np.full((len(snippets), SEQUENCE_LENGTH), IGNORE_INDEX, dtype=np.int64)
    for row, (snippet, after) in enumerate(zip(snippets, next_characters)):
        text = str(snippet)[-SEQUENCE_LENGTH:]
        following = (text + str(after))[1 : len(text) + 1]
        inputs[row, : len(text)] = [lookup.get(c, OOV_ID) for c in text]
        targets[row, : len(following)] = [lookup.get(c, OOV_ID) for c in following]
    return inputs, targets


# What an id outside the vocabulary decodes to: a character it does not hold, so that it
# encodes to OOV_ID again.
OOV_CHARACTER = "~"


def decode_text(inputs: np.ndarray, targets: np.ndarray) -> tuple[list[str], list[str]]:
    """The snippets and next characters that :func:`encode_text` turns into ``inputs`` and
    ``targets`` again, id for id (a node's own text: experiments.write_partitions)."""
    characters = {i + 2: c for i, c in enumerate(VOCABULARY)}
    snippets, following = [], []
    for ids, after in zip(inputs, targets):
        length = int((ids != PAD_ID).sum())
        snippets.append("".join(characters.get(int(i), OOV_CHARACTER) for i in ids[:length]))
        last = int(after[length - 1]) if length else IGNORE_INDEX
        following.append("" if last == IGNORE_INDEX else characters.get(last, OOV_CHARACTER))
    return snippets, following
