"""Fetch the project's Java dependencies from Maven Central into a local jar cache.

Each bundle is a pom under ``deploy/<bundle>/pom.xml``. The first call copies the bundle's
runtime jars (with their transitive dependencies) into ``<cache>/jars/<bundle>-<digest>``,
where the digest covers the pom, so a changed pom fetches again and an unchanged one is a
directory listing. Maven's own ``~/.m2`` cache makes a re-fetch after a pom change fast.

Jars are fetched at install time: ``millpond jars`` (or ``make install``) fetches every
bundle. Services only look jars up (:func:`installed_jars`) and never run Maven; a missing
bundle is an error that names the command to run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from millpond.shared.errors import SetupError

DEPLOY_DIR = Path(__file__).resolve().parent
BUNDLES = ("kafka", "spark", "kafka-tools")
_MARKER = ".complete"


def cache_root() -> Path:
    """Where fetched jars live: ``$MILLPOND_CACHE`` or ``~/.cache/millpond``."""
    return Path(os.environ.get("MILLPOND_CACHE", Path.home() / ".cache" / "millpond"))


def _bundle_dir(bundle: str, cache: Path | None) -> Path:
    if bundle not in BUNDLES:
        raise SetupError(f"unknown jar bundle {bundle!r}; expected one of {BUNDLES}")
    pom = DEPLOY_DIR / bundle / "pom.xml"
    settings = DEPLOY_DIR / "maven-settings.xml"
    digest = hashlib.sha256(pom.read_bytes() + settings.read_bytes()).hexdigest()[:12]
    return (cache or cache_root()) / "jars" / f"{bundle}-{digest}"


def installed_jars(bundle: str, cache: Path | None = None) -> list[Path]:
    """The jars of ``bundle`` already fetched into ``cache`` (default :func:`cache_root`).
    Never fetches: when they are missing the error says to run ``millpond jars``."""
    target = _bundle_dir(bundle, cache)
    if not (target / _MARKER).exists():
        raise SetupError(f"the {bundle} jars are not in {target}; fetch them with `millpond jars` (or `make install`)"
                         + (f" with MILLPOND_CACHE={cache}" if cache else ""))
    return sorted(target.glob("*.jar"))


def ensure_jars(bundle: str, cache: Path | None = None) -> list[Path]:
    """The jars of ``bundle``, fetching them with Maven the first time."""
    target = _bundle_dir(bundle, cache)
    if not (target / _MARKER).exists():
        _fetch(bundle, target)
    return installed_jars(bundle, cache)


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
