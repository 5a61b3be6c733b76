package io.millpond.spark;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.sql.api.java.UDF3;
import org.apache.spark.sql.api.java.UDF4;

/**
 * ksqlDB's REGEXP functions as Spark's own regexp_extract, regexp_extract_all, regexp_replace
 * and split compute them (java.util.regex over the text, the same calls), each call within a
 * time budget (its last argument, in milliseconds). java.util.regex has no limit of its own
 * and does not stop for a task's interrupt: a pattern that backtracks without end over one
 * record ({@code ((a+)+)+b} over 40 characters: Java memoizes a greedy group's loop, not nested
 * ones) held its batch, and on a local[1] master the worker's only Spark thread, for as long as
 * it took. Over its budget a call throws a
 * {@link PatternTimeout}, which fails the task, and the worker sets the record aside
 * (QueryRunner._in_parts). The Python side stops a pull's call at the same budget.
 *
 * <p>Every function gives NULL for a NULL argument, as Spark's. A pattern is compiled once per
 * distinct text (each is a literal of its query).
 */
public final class Regexps {
  private Regexps() {}

  /** A call of a REGEXP function that ran over its budget. */
  public static final class PatternTimeout extends RuntimeException {
    private static final long serialVersionUID = 1L;

    PatternTimeout(String pattern, int length, long budgetMs) {
      super("the pattern '" + pattern + "' took over " + budgetMs / 1000.0 + " s on a text of " + length
          + " characters (it backtracks too much): simplify it");
    }
  }

  /**
   * A text whose reading stops once a deadline has passed: every step of a match reads a
   * character, and every 1,024th read looks at the clock.
   */
  static final class Budgeted implements CharSequence {
    private final String text;
    private final String pattern;
    private final long budgetMs;
    private final long deadline;
    private int reads;

    Budgeted(String text, String pattern, long budgetMs) {
      this.text = text;
      this.pattern = pattern;
      this.budgetMs = budgetMs;
      this.deadline = System.nanoTime() + budgetMs * 1_000_000L;
    }

    @Override
    public char charAt(int index) {
      if ((++reads & 1023) == 0 && System.nanoTime() - deadline > 0) {
        throw new PatternTimeout(pattern, text.length(), budgetMs);
      }
      return text.charAt(index);
    }

    @Override
    public int length() {
      return text.length();
    }

    @Override
    public CharSequence subSequence(int start, int end) {
      return text.subSequence(start, end);
    }

    @Override
    public String toString() {
      return text;
    }
  }

  /** A pattern compiled, with its text: the last one a function instance was given. */
  private record Compiled(String text, Pattern pattern) {}

  /**
   * What each function shares: its last pattern, compiled (a function instance may serve
   * several threads). Serializable, as Spark sends a function with its task.
   */
  abstract static class Function implements Serializable {
    private static final long serialVersionUID = 1L;

    private transient volatile Compiled last;

    final Pattern compiled(String pattern) {
      Compiled compiled = last;
      if (compiled == null || !compiled.text().equals(pattern)) {
        compiled = new Compiled(pattern, Pattern.compile(pattern));
        last = compiled;
      }
      return compiled.pattern();
    }

    final Matcher matcher(String text, String pattern, long budgetMs) {
      return compiled(pattern).matcher(new Budgeted(text, pattern, budgetMs));
    }
  }

  /** Spark's regexp_extract, but NULL where nothing matches (ksqlDB's; Spark's gives ''). */
  public static final class Extract extends Function implements UDF4<String, String, Integer, Integer, String> {
    @Override
    public String call(String text, String pattern, Integer group, Integer budgetMs) {
      if (text == null || pattern == null || group == null || budgetMs == null) {
        return null;
      }
      Matcher m = matcher(text, pattern, budgetMs);
      if (!m.find()) {
        return null;
      }
      String found = m.group(group);
      return found == null ? "" : found;
    }
  }

  /** Spark's regexp_extract_all: the group of every match ('' where it took no part). */
  public static final class ExtractAll extends Function implements UDF4<String, String, Integer, Integer, List<String>> {
    @Override
    public List<String> call(String text, String pattern, Integer group, Integer budgetMs) {
      if (text == null || pattern == null || group == null || budgetMs == null) {
        return null;
      }
      Matcher m = matcher(text, pattern, budgetMs);
      List<String> found = new ArrayList<>();
      while (m.find()) {
        String one = m.group(group);
        found.add(one == null ? "" : one);
      }
      return found;
    }
  }

  /** Spark's regexp_replace: every match replaced, Java's replacement syntax. */
  public static final class Replace extends Function implements UDF4<String, String, String, Integer, String> {
    @Override
    public String call(String text, String pattern, String replacement, Integer budgetMs) {
      if (text == null || pattern == null || replacement == null || budgetMs == null) {
        return null;
      }
      Matcher m = matcher(text, pattern, budgetMs);
      StringBuilder result = new StringBuilder();
      while (m.find()) {
        m.appendReplacement(result, replacement);
      }
      m.appendTail(result);
      return result.toString();
    }
  }

  /**
   * Spark's split(text, pattern, -1): Java's String.split keeping trailing empty parts; an
   * empty pattern splits a text into its characters (code points), and an empty text is one
   * empty part.
   */
  public static final class Split extends Function implements UDF3<String, String, Integer, List<String>> {
    @Override
    public List<String> call(String text, String pattern, Integer budgetMs) {
      if (text == null || pattern == null || budgetMs == null) {
        return null;
      }
      if (pattern.isEmpty() && !text.isEmpty()) {
        return text.codePoints().mapToObj(Character::toString).toList();
      }
      if (oneCharacter(pattern)) {
        return List.of(text.split(pattern, -1)); // String.split's own path, no regex (nor time to budget)
      }
      return List.of(compiled(pattern).split(new Budgeted(text, pattern, budgetMs), -1));
    }

    /** Whether String.split takes ``pattern`` for one character, without a regex: the same parts, twice as fast. */
    private static boolean oneCharacter(String pattern) {
      if (pattern.length() == 1) {
        return ".$|()[{^?*+\\".indexOf(pattern.charAt(0)) < 0;
      }
      char c = pattern.length() == 2 && pattern.charAt(0) == '\\' ? pattern.charAt(1) : '0';
      return !Character.isLetterOrDigit(c) && c < 128;
    }
  }
}
