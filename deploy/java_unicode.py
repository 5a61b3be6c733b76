"""Generate ``shared/sql/java_unicode.py``: every character's general category as the JVM that
runs Spark has it, which java.util.regex's ``\\p{..}`` classes and word boundary read.

Java 17's are Unicode 13.0's (``\\b`` counts a letter or digit of any script and a non-spacing
mark after one; ``\\p{Lu}`` is ``Character.getType``'s), which is neither Python's ``unicodedata``
nor the ``regex`` module's Unicode. The ranges are asked of ``java`` itself (a JDK's single-file
source launch), so they are the JVM's exactly; ``make protos-check`` runs this again and fails when
the committed module differs (a JVM of another Unicode reads patterns otherwise).
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "shared" / "sql" / "java_unicode.py"

_SOURCE = """
public class Ranges {
  /** Each Character.getType's abbreviation, by its number. */
  static final String[] NAMES = {"Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Me", "Mc", "Nd", "Nl", "No", "Zs",
      "Zl", "Zp", "Cc", "Cf", null, "Co", "Cs", "Pd", "Ps", "Pe", "Pc", "Po", "Sm", "Sc", "Sk", "So", "Pi", "Pf"};

  public static void main(String[] args) {
    System.out.println(Runtime.version().feature());
    StringBuilder[] lines = new StringBuilder[NAMES.length];
    int type = -1;
    for (int c = 0; c <= Character.MAX_CODE_POINT + 1; c++) {
      int next = c <= Character.MAX_CODE_POINT ? Character.getType(c) : -1;
      if (next == type) {
        continue;
      }
      if (type >= 0) {
        lines[type].append(Integer.toHexString(c - 1)).append(' ');
      }
      if (next >= 0) {
        if (lines[next] == null) {
          lines[next] = new StringBuilder(NAMES[next]).append(' ');
        }
        lines[next].append(Integer.toHexString(c)).append('-');
      }
      type = next;
    }
    for (StringBuilder line : lines) {
      if (line != null) {
        System.out.println(line.toString().trim());
      }
    }
    scripts();
  }

  /** Each script's ranges (Character.UnicodeScript.of), then every other name forName takes for it. */
  static void scripts() {
    Character.UnicodeScript script = null;
    java.util.Map<Character.UnicodeScript, StringBuilder> lines = new java.util.TreeMap<>();
    for (int c = 0; c <= Character.MAX_CODE_POINT + 1; c++) {
      Character.UnicodeScript next = c <= Character.MAX_CODE_POINT ? Character.UnicodeScript.of(c) : null;
      if (next == script) {
        continue;
      }
      if (script != null) {
        lines.get(script).append(Integer.toHexString(c - 1)).append(' ');
      }
      if (next != null) {
        lines.computeIfAbsent(next, s -> new StringBuilder("script:" + s.name() + " ")).append(Integer.toHexString(c)).append('-');
      }
      script = next;
    }
    lines.values().forEach(line -> System.out.println(line.toString().trim()));
    char[] code = new char[4]; // the aliases: four letters each (ISO 15924)
    for (int n = 0; n < 26 * 26 * 26 * 26; n++) {
      for (int k = 0, m = n; k < 4; k++, m /= 26) {
        code[3 - k] = (char) ('A' + m % 26);
      }
      String alias = new String(code);
      try {
        Character.UnicodeScript named = Character.UnicodeScript.forName(alias);
        if (!named.name().equals(alias)) {
          System.out.println("alias:" + alias + " " + named.name());
        }
      } catch (IllegalArgumentException unknown) {
        // not a script's alias
      }
    }
  }
}
"""


Classes = dict[str, list[tuple[int, int]]]


def java_ranges() -> tuple[str, Classes, Classes, dict[str, str]]:
    """The Java runtime's feature version; each general category's code point ranges (first, last)
    by its abbreviation, as ``Character.getType`` gives them; each script's by its name
    (``Character.UnicodeScript.of``); and the scripts' other names (their four-letter aliases)."""
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "Ranges.java"
        source.write_text(_SOURCE)
        lines = subprocess.run(["java", str(source)], check=True, capture_output=True, text=True, timeout=300).stdout.split("\n")
    categories: Classes = {}
    scripts: Classes = {}
    aliases = {}
    for line in lines[1:]:
        if line.startswith("alias:"):
            alias, script = line.removeprefix("alias:").split()
            aliases[alias] = script
        elif line:
            name, *ranges = line.split()
            kind, _, name = name.rpartition(":")
            (scripts if kind else categories)[name] = [(int(a, 16), int(b, 16)) for a, b in (r.split("-") for r in ranges)]
    return lines[0].strip(), dict(sorted(categories.items())), dict(sorted(scripts.items())), dict(sorted(aliases.items()))


def module_text(version: str, categories: Classes, scripts: Classes, aliases: dict[str, str]) -> str:
    """The module: each class as one string of its ranges (``first-last`` in hex, a space between),
    which Python reads at once where tuples of numbers took 60-90 ms of every process's import."""
    out = ['"""Generated by ``python -m millpond.deploy.java_unicode`` (deploy/java_unicode.py) from the',
           f'JVM, Java {version}: do not edit. Each general category (``Character.getType``) by its',
           "abbreviation, and each script (``Character.UnicodeScript``) by its name: its code point ranges,",
           "each ``first-last`` in hex, a space between; and the scripts' aliases",
           '(``UnicodeScript.forName``)."""', "", f"JAVA_VERSION = {version}", ""]
    for title, classes in (("CATEGORIES", categories), ("SCRIPTS", scripts)):
        out.append(f"{title} = {{")
        for name, ranges in classes.items():
            text = " ".join(f"{first:x}-{last:x}" for first, last in ranges)
            out.append(f'    "{name}": (')
            while text:
                cut = len(text) if len(text) <= 100 else text.rindex(" ", 0, 100) + 1
                out.append(f'        "{text[:cut]}"')
                text = text[cut:]
            out.append("    ),")
        out += ["}", ""]
    out.append("SCRIPT_ALIASES = {")
    row = "   "
    for alias, script in aliases.items():
        item = f' "{alias}": "{script}",'
        if len(row) + len(item) > 110:
            out.append(row)
            row = "   "
        row += item
    out += [row, "}", ""]
    return "\n".join(out)


def main() -> None:
    OUT.write_text(module_text(*java_ranges()))


if __name__ == "__main__":
    main()
