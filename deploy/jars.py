"""Fetch the project's Java dependencies from Maven Central into a local jar cache.

Each bundle is a pom under ``deploy/<bundle>/pom.xml``. The first call copies the bundle's
runtime jars (with their transitive dependencies) into ``<cache>/jars/<bundle>-<digest>``,
where the digest covers the pom, so a changed pom fetches again and an unchanged one is a
directory listing. Maven's own ``~/.m2`` cache makes a re-fetch after a pom change fast.

Run ``python -m deploy.jars`` to fetch every bundle ahead of time.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from shared.errors import SetupError

DEPLOY_DIR = Path(__file__).resolve().parent
BUNDLES = ("kafka", "spark", "kafka-tools")
_MARKER = ".complete"


def cache_root() -> Path:
    """Where fetched jars live: ``$MILLPOND_CACHE`` or ``~/.cache/millpond``."""
    return Path(os.environ.get("MILLPOND_CACHE", Path.home() / ".cache" / "millpond"))


def _bundle_dir(bundle: str) -> Path:
    pom = DEPLOY_DIR / bundle / "pom.xml"
    settings = DEPLOY_DIR / "maven-settings.xml"
    digest = hashlib.sha256(pom.read_bytes() + settings.read_bytes()).hexdigest()[:12]
    return cache_root() / "jars" / f"{bundle}-{digest}"


def ensure_jars(bundle: str) -> list[Path]:
    """Return the jars of ``bundle``, fetching them with Maven the first time."""
    if bundle not in BUNDLES:
        raise SetupError(f"unknown jar bundle {bundle!r}; expected one of {BUNDLES}")
    target = _bundle_dir(bundle)
    if not (target / _MARKER).exists():
        _fetch(bundle, target)
    return sorted(target.glob("*.jar"))


def _fetch(bundle: str, target: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SetupError("Maven (mvn) is not on PATH; install it with `apt-get install maven`")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{bundle}-", dir=target.parent))
    cmd = [
        mvn, "-q", "-B",
        "-s", str(DEPLOY_DIR / "maven-settings.xml"),
        "-f", str(DEPLOY_DIR / bundle / "pom.xml"),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
        raise SetupError(f"fetching the {bundle} jars from Maven Central failed:\n{tail}")
    (staging / _MARKER).touch()
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


def main() -> None:
    """Fetch every bundle and print where its jars are."""
    for bundle in BUNDLES:
        jars = ensure_jars(bundle)
        print(f"{bundle}: {len(jars)} jars in {jars[0].parent}", file=sys.stdout)


if __name__ == "__main__":
    main()
