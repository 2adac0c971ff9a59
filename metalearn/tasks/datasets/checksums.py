"""Published checksums of the files the loaders read, and the check against them.

:data:`PUBLISHED` is the one table: for each file a user downloads whose size and
SHA-256 the distributors (or tensorflow-datasets' ``url_checksums`` records of the
official download URLs) publish, the figures and where they come from. A loader calls
:func:`verify` on such a file before it reads it: the size first (free), then the
SHA-256 (streamed in 1 MiB chunks). A file whose name is not in the table, or whose
table entry belongs to another data set, is not checked: nothing publishes a figure
for it (uncompressed MNIST IDX files, mini-ImageNet and tiered-ImageNet caches, image
folders, extracted archives). :func:`verify_download` checks any file of the table by
hand (``CUB_200_2011.tgz`` before extracting it: ``load_cub`` reads the extracted
folder).

Each file is hashed once per process: the digest is kept by (absolute path, size,
modification time), so later loads, sweeps and evaluations in the same process pay a
``stat`` only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Dict, Optional, Tuple


@dataclasses.dataclass(frozen=True)
class Published:
    """The published size and SHA-256 of one downloadable file."""

    dataset: str   # the loader's data set: "omniglot", "mnist", "cub"
    size: int      # bytes
    sha256: str
    url: str       # the download URL the figures are for
    source: str    # where the figures are published


_TFDS = "tensorflow-datasets' url_checksums/{}.txt (tensorflow/datasets, 4.9.10)"

# (file, size in bytes, sha256) of each file a user downloads, by where the figures are
# published and the URL they are for (the folder + the file, or one URL).
_FIGURES = (
    ("omniglot", _TFDS.format("omniglot"),
     "https://github.com/brendenlake/omniglot/raw/master/python/", (
         ("images_background.zip", 9464212,
          "ad41ab679c8b5d90b271ef46be6987cc81211774a695c29dcc5367b2b26ee640"),
         ("images_evaluation.zip", 6462886,
          "1f61a8f3366785b057fc117d9228e78a16e3d976c8953b2a10fcc74cf0609cee"),
         ("images_background_small1.zip", 1319022,
          "f38eb80f801274ac2b4dff5b24289016bfaba4a7d5bb50deebf27104ad6cb8a4"),
         ("images_background_small2.zip", 1580917,
          "3ccaa407515a8778e5d0861875af38b17e418f301ad5bb3b5a6b65d901a41c7f"))),
    ("mnist", _TFDS.format("mnist"), "https://storage.googleapis.com/cvdf-datasets/mnist/", (
        ("train-images-idx3-ubyte.gz", 9912422,
         "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"),
        ("train-labels-idx1-ubyte.gz", 28881,
         "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"),
        ("t10k-images-idx3-ubyte.gz", 1648877,
         "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6"),
        ("t10k-labels-idx1-ubyte.gz", 4542,
         "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"))),
    ("cub", _TFDS.format("caltech_birds2011"),
     "https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz?download=1", (
         ("CUB_200_2011.tgz", 1150585339,
          "0c685df5597a8b24909f6a7c9db6d11e008733779a671760afef78feb49bf081"),)),
)

PUBLISHED: Dict[str, Published] = {
    name: Published(dataset, size, sha256,
                    url if url.endswith("=1") else url + name, source)
    for dataset, source, url, files in _FIGURES for name, size, sha256 in files}
"""File name -> its published size and SHA-256, with the URL and where the figures are
published. Only files named here are checked."""

CHUNK_BYTES = 1 << 20
_DIGESTS: Dict[Tuple[str, int, int], str] = {}


class ChecksumError(ValueError):
    """A file of a published name is not the published file (its size or SHA-256)."""


def sha256_of(file: str) -> str:
    """The file's SHA-256 (hex), streamed in chunks; computed once per (absolute path,
    size, modification time) in a process."""
    stat = os.stat(file)
    key = (os.path.abspath(file), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with open(file, "rb") as f:
            for chunk in iter(lambda: f.read(CHUNK_BYTES), b""):
                digest.update(chunk)
        _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


def published(file: str, dataset: str) -> Optional[Published]:
    """The table's entry for ``file`` (by its name) if it is one of ``dataset``'s."""
    entry = PUBLISHED.get(os.path.basename(file))
    return entry if entry is not None and entry.dataset == dataset else None


def verify(file: str, dataset: str, what: str, loader: Optional[str]) -> None:
    """Raises :class:`ChecksumError` unless ``file`` is the published file of its name.

    Args:
      file: the local file, about to be read.
      dataset: the data set whose table entries apply (``"omniglot"``, ...).
      what: what the file is, for the message (``"Omniglot archive"``).
      loader: the loader's name, for the message's way out
        (``load_omniglot(verify_checksums=False)``); ``None``: no way out named.

    A file whose name has no entry of ``dataset`` in :data:`PUBLISHED` is not checked.
    """
    entry = published(file, dataset)
    if entry is None:
        return
    size = os.path.getsize(file)
    if size != entry.size:
        found = f"{size} bytes, the published file {entry.size} bytes (sha256 {entry.sha256})"
    else:
        actual = sha256_of(file)
        if actual == entry.sha256:
            return
        found = f"sha256 {actual}, the published file's is {entry.sha256}"
    skip = ("" if loader is None else f", or pass {loader}(verify_checksums=False) (gin: "
            f"{loader}.verify_checksums = False) to read it unchecked")
    raise ChecksumError(
        f"{what} {file!r} is not the published file: {found}; figures from {entry.source}"
        f", for {entry.url}. Download it again{skip}")


def verify_download(file: str) -> Optional[Published]:
    """Checks a downloaded file of any data set in :data:`PUBLISHED` (e.g.
    ``CUB_200_2011.tgz`` before extracting it); returns its entry, or ``None`` (not
    checked) for a name the table lacks.

    Raises:
      ChecksumError: ``file`` is not the published file of its name.
    """
    entry = PUBLISHED.get(os.path.basename(file))
    if entry is not None:
        verify(file, entry.dataset, "downloaded file", None)
    return entry
