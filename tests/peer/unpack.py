"""Unpacks one folder of llama.cpp's source tarball (../shared/peers/llama.cpp-lcp0336.tar.gz, found beside
FERRY_TESTDATA) for the tests that compare against the peer's data (templates, grammars, server tests)."""
import os
import tarfile

TARBALL_NAME = "llama.cpp-lcp0336.tar.gz"


def tarball():
    """The tarball's path, or None when it is missing."""
    testdata = os.environ.get("FERRY_TESTDATA", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared",
                                                             "testdata"))
    path = os.path.join(os.path.dirname(os.path.abspath(testdata)), "peers", TARBALL_NAME)
    return path if os.path.exists(path) else None


def unpack(folder, dest, suffix=""):
    """Copies the files directly in FOLDER (e.g. "models/templates") whose names end with suffix into dest;
    returns their names. Raises FileNotFoundError when the tarball is missing."""
    path = tarball()
    if not path:
        raise FileNotFoundError(TARBALL_NAME)
    want = folder.strip("/").split("/")
    os.makedirs(dest, exist_ok=True)
    names = []
    with tarfile.open(path) as tf:
        for m in tf.getmembers():
            parts = m.name.split("/")
            if m.isfile() and parts[1:-1] == want and parts[-1].endswith(suffix):
                with open(os.path.join(dest, parts[-1]), "wb") as f:
                    f.write(tf.extractfile(m).read())
                names.append(parts[-1])
    return sorted(names)
