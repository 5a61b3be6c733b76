"""Fetch the project's Java dependencies from Maven Central into a local jar cache.

Each bundle is a pom under ``deploy/<bundle>/pom.xml``. The first call copies the bundle's
runtime jars (with their transitive dependencies) into ``<cache>/jars/<bundle>-<digest>``,
where the digest covers the pom, so a changed pom fetches again and an unchanged one is a
directory listing. A bundle with Java sources (``deploy/<bundle>/src``) is built too, its own
jar beside its dependencies, and the digest covers the sources. Maven's own ``~/.m2`` cache
makes a re-fetch after a pom change fast.

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
from collections.abc import Callable
from pathlib import Path

from millpond.shared.errors import SetupError

DEPLOY_DIR = Path(__file__).resolve().parent
BUNDLES = ("kafka", "spark", "kafka-tools")
_MARKER = ".complete"


def cache_root() -> Path:
    """Where fetched jars live: ``$MILLPOND_CACHE`` or ``~/.cache/millpond``."""
    return Path(os.environ.get("MILLPOND_CACHE", Path.home() / ".cache" / "millpond"))


def project_digest(project: Path) -> str:
    """A digest of the Maven project in ``project``: its pom, its sources (``src``) and the
    Maven settings every build here uses."""
    digest = hashlib.sha256()
    for path in [project / "pom.xml", *sorted(p for p in (project / "src").rglob("*") if p.is_file())]:
        digest.update(str(path.relative_to(project)).encode() + b"\0" + path.read_bytes())
    digest.update((DEPLOY_DIR / "maven-settings.xml").read_bytes())
    return digest.hexdigest()[:12]


def _bundle_dir(bundle: str, cache: Path | None) -> Path:
    if bundle not in BUNDLES:
        raise SetupError(f"unknown jar bundle {bundle!r}; expected one of {BUNDLES}")
    return (cache or cache_root()) / "jars" / f"{bundle}-{project_digest(DEPLOY_DIR / bundle)}"


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
    project = DEPLOY_DIR / bundle
    if (project / "src").is_dir():
        build_once(target, lambda staging: package(project, staging, f"building the {bundle} jars (deploy/{bundle})"))
    else:
        build_once(target, lambda staging: run_maven(
            project / "pom.xml",
            ["dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={staging}"],
            f"fetching the {bundle} jars from Maven Central"))


def package(project: Path, staging: Path, doing: str) -> None:
    """Build the Maven project in ``project`` (its build directory in ``staging``, outside
    the source tree) and put its jar and its runtime dependencies in ``staging``."""
    if shutil.which("javac") is None:
        raise SetupError(f"a Java 17 JDK (javac) is needed for {doing}; `apt-get install openjdk-17-jdk-headless`")
    out = staging / "build"
    run_maven(project / "pom.xml", [f"-Dout.directory={out}", "package", "dependency:copy-dependencies",
                                    "-DincludeScope=runtime", f"-DoutputDirectory={staging}"], doing)
    for jar in out.glob("*.jar"):
        jar.rename(staging / jar.name)
    shutil.rmtree(out)


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """``target``, made the first time by ``build(staging)`` into a fresh folder beside it
    that becomes ``target`` only once ``build`` returned: an interrupted or failed build
    leaves nothing that a later call could take for complete. Later calls are a file check."""
    if (target / _MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    (staging / _MARKER).touch()
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def run_maven(pom: Path, arguments: list[str], doing: str) -> None:
    """Maven on ``pom`` with the project's settings (every artifact from Maven Central); a
    SetupError saying what failed (``doing``) with Maven's last lines when it does."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SetupError("Maven (mvn) is not on PATH; install it with `apt-get install maven`")
    cmd = [mvn, "-q", "-B", "-s", str(DEPLOY_DIR / "maven-settings.xml"), "-f", str(pom), *arguments]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
        raise SetupError(f"{doing} failed:\n{tail}")
