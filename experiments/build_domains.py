"""Build the local copy of a multi-domain image set (Digit-Five, PACS) that Basin's presets read,
from image folders of the public sources a user downloads:

    .venv/bin/python -m experiments.build_domains --out digit-five \\
        --domain mnist=src/mnist --domain mnistm=src/mnistm --domain svhn=src/svhn \\
        --domain syn=src/syn --domain usps=src/usps
    .venv/bin/python -m experiments.build_domains --out pacs \\
        --domain photo=PACS/kfold/photo --domain art_painting=PACS/kfold/art_painting \\
        --domain cartoon=PACS/kfold/cartoon --domain sketch=PACS/kfold/sketch

Each domain is a folder of class folders (``<class>/<image>``), or of ``train/<class>/…`` and
``test/<class>/…``. A class is its folder's name; the labels are the sorted names of every
domain's classes (digits ``0`` … ``9``; PACS's ``dog``, ``elephant``, … ``person``), the same in
every domain. The copy is ``OUT/data/train-00000-of-00001.parquet`` (and ``test-…`` where the
domains have test folders): an ``image``, a ``label`` (a ClassLabel with the class names) and a
``domain`` column, as ``dataset = "hf:OUT"`` loads it (ima-digit5, ima-pacs). ``OUT/sources.json``
records each domain's folder, its images, and a SHA-256 over its files (their relative paths and
bytes): ``--check OUT`` recomputes them from the same folders, so a copy built elsewhere can be
told apart from this one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
SOURCES_FILE = "sources.json"


class BuildError(ValueError):
    """A domain folder that is not one of class folders, in one line."""


def domain_images(folder: Path) -> dict[str, list[tuple[Path, str]]]:
    """{split: [(image, class name)]} of one domain's folder (see the module docstring)."""
    if not folder.is_dir():
        raise BuildError(f"domain folder {folder}: no such folder")
    splits = {split: folder / split for split in ("train", "test") if (folder / split).is_dir()} or {"train": folder}
    found: dict[str, list[tuple[Path, str]]] = {}
    for split, root in splits.items():
        classes = sorted(entry for entry in root.iterdir() if entry.is_dir())
        images = [(image, c.name) for c in classes for image in sorted(c.rglob("*"))
                  if image.suffix.lower() in IMAGE_SUFFIXES]
        if not images:
            raise BuildError(f"domain folder {root}: expected class folders (<class>/<image>) holding images; found "
                             f"{', '.join(sorted(e.name for e in root.iterdir())[:5]) or 'nothing'}")
        found[split] = images
    return found


def folder_digest(folder: Path) -> str:
    """SHA-256 over every file under ``folder``: its path relative to ``folder``, then its bytes."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def build(domains: Mapping[str, Path], out: Path) -> dict[str, Any]:
    """Write the copy of ``domains`` ({name: folder}) to ``out``; return what sources.json records."""
    import datasets

    images = {name: domain_images(Path(folder)) for name, folder in domains.items()}
    classes = sorted({c for splits in images.values() for rows in splits.values() for _, c in rows})
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=classes),
                                  "domain": datasets.Value("string")})
    splits = sorted({split for found in images.values() for split in found})
    (out / "data").mkdir(parents=True, exist_ok=True)
    for split in splits:
        # the images' bytes, not their paths: the copy stands alone (to_parquet keeps what the column holds)
        rows = [({"bytes": image.read_bytes(), "path": image.name}, classes.index(c), name)
                for name, found in images.items() for image, c in found.get(split, [])]
        table = {"image": [r[0] for r in rows], "label": [r[1] for r in rows], "domain": [r[2] for r in rows]}
        datasets.Dataset.from_dict(table, features=features).to_parquet(
            str(out / "data" / f"{split}-00000-of-00001.parquet"))
    record = {"classes": classes, "domains": {
        name: {"folder": str(Path(folder).resolve()), "sha256": folder_digest(Path(folder)),
               "images": {split: len(rows) for split, rows in images[name].items()}}
        for name, folder in domains.items()}}
    (out / SOURCES_FILE).write_text(json.dumps(record, indent=1))
    return record


def check(out: Path) -> list[str]:
    """What differs between ``out``'s sources.json and its domains' folders now ([] when nothing)."""
    record = json.loads((out / SOURCES_FILE).read_text())
    problems = []
    for name, source in record["domains"].items():
        folder = Path(source["folder"])
        if not folder.is_dir():
            problems.append(f"domain {name}: its folder {folder} is gone")
        elif folder_digest(folder) != source["sha256"]:
            problems.append(f"domain {name}: the files in {folder} are not the ones the copy was built from "
                            f"(SHA-256 {source['sha256'][:12]}…)")
    return problems


def parse_domains(entries: Sequence[str]) -> dict[str, Path]:
    domains: dict[str, Path] = {}
    for entry in entries:
        name, sep, folder = entry.partition("=")
        if not sep or not name or not folder:
            raise BuildError(f"--domain {entry!r}: expected NAME=FOLDER, e.g. --domain svhn=src/svhn")
        if name in domains:
            raise BuildError(f"--domain {name} is given twice")
        domains[name] = Path(folder)
    return domains


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m experiments.build_domains", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="the copy's folder (then dataset = 'hf:OUT')")
    parser.add_argument("--domain", action="append", default=[], metavar="NAME=FOLDER",
                        help="a domain and its folder of class folders; repeat per domain")
    parser.add_argument("--check", type=Path, metavar="OUT", help="recompute a copy's sources' SHA-256s; build nothing")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = check(args.check)
            for problem in problems:
                print(f"error: {problem}", file=sys.stderr)
            print("the sources match" if not problems else f"{len(problems)} domain(s) differ")
            return 1 if problems else 0
        if not args.out or len(args.domain) < 2:
            raise BuildError("give --out and at least two --domain NAME=FOLDER (or --check OUT)")
        record = build(parse_domains(args.domain), args.out)
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    counts = ", ".join(f"{name} {sum(d['images'].values()):,}" for name, d in record["domains"].items())
    print(f"{args.out}: {len(record['classes'])} classes; images per domain: {counts}; use --set dataset=hf:{args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
