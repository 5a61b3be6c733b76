"""What each function does, in a sentence, as DESCRIBE FUNCTION shows it (ksqlDB's overview).
Every function the dialect has is here (a unit test checks both ways)."""

from __future__ import annotations

OVERVIEWS: dict[str, str] = {
    # ---- text
    "UCASE": "The text in upper case.",
    "LCASE": "The text in lower case.",
    "INITCAP": "The text with the first letter of each word in upper case and the rest in lower case.",
    "TRIM": "The text without the spaces (U+0020) at its start and end.",
    "LTRIM": "The text without the spaces (U+0020) at its start.",
    "RTRIM": "The text without the spaces (U+0020) at its end.",
    "LEN": "The number of characters of the text.",
    "CONCAT": "The texts one after the other; NULL if any is NULL.",
    "CONCAT_WS": "The texts after the first, joined by the first (the separator); NULL ones are left out.",
    "SPLIT": "The parts of the text between the occurrences of the delimiter, as an ARRAY; an empty delimiter "
             "splits it into its characters.",
    "SPLIT_TO_MAP": "A MAP of the text's entries (between the first delimiter; empty ones left out) that have the "
                    "second delimiter, each a key before it and a value after it.",
    "CHR": "The character of a Unicode code point, or of its UTF-16 escapes ('\\u004b', a pair for one beyond "
           "the BMP); NULL for none (and for a surrogate alone).",
    "URL_ENCODE_PARAM": "The text encoded for a URL's query (application/x-www-form-urlencoded, UTF-8).",
    "URL_DECODE_PARAM": "A URL query's encoded text decoded (+ a space, %XX bytes in UTF-8); NULL for a % without "
                        "two hexadecimal digits.",
    "SUBSTRING": "The part of the text from a position (1 is the first character; negative counts from the end), "
                 "to its end or of the given length.",
    "ELT": "The n-th of the texts after the first argument (from 1); NULL when there is no such text.",
    "FIELD": "The place (from 1) of the first text among the others; 0 when it is not there or is NULL.",
    "UUID": "A random UUID (version 4) as text, a new one each call.",
    "INSTR": "The position (from 1) of the first occurrence of the second text in the first; 0 when there is none.",
    "REPLACE": "The text with every occurrence of the second text replaced by the third.",
    "LPAD": "The text padded at its start with the padding text, repeated, to the given length (or cut to it).",
    "RPAD": "The text padded at its end with the padding text, repeated, to the given length (or cut to it).",
    "MASK": "The text with upper-case letters as X, lower-case as x, digits as n and other characters as -, or as "
            "the characters given for each.",
    "MASK_LEFT": "The text with its first n characters masked as MASK masks them.",
    "MASK_RIGHT": "The text with its last n characters masked as MASK masks them.",
    "MASK_KEEP_LEFT": "The text masked as MASK masks it, but for its first n characters.",
    "MASK_KEEP_RIGHT": "The text masked as MASK masks it, but for its last n characters.",
    "IS_JSON_STRING": "Whether the text starts with a JSON value (strings may be in single quotes); FALSE for NULL.",
    "JSON_ARRAY_LENGTH": "The number of items of the JSON array the text starts with; NULL for any other value.",
    "JSON_KEYS": "The field names of the JSON object the text starts with, in order, as an ARRAY; NULL for any "
                 "other value.",
    "JSON_ITEMS": "The items of a JSON array, each as JSON text, as an ARRAY; NULL for text that is not a JSON array.",
    "JSON_RECORDS": "The fields of a JSON object as a MAP of each name to its value as JSON text; NULL for text that is "
                    "not a JSON object.",
    "JSON_CONCAT": "JSON texts joined: objects' fields merged (a later text's value kept), else arrays' items one "
                   "after the other (any other value as one item); NULL if a text is NULL or not JSON.",
    "JSON_ARRAY_CONTAINS": "Whether a JSON array has an item equal to the value (a string to a VARCHAR, an integer to an "
                           "INT or BIGINT, a number with a point or exponent (or an integer beyond BIGINT) to a "
                           "DOUBLE, true or false to a BOOLEAN, null to NULL); FALSE for text that is not a JSON array.",
    "TO_JSON_STRING": "Any value as JSON text (a STRUCT as an object of its fields, a MAP as an object, a TIMESTAMP "
                      "as UTC text, BYTES in base64; NULL as null).",
    "EXTRACTJSONFIELD": "The value at a JSON path ('$.a.b[0]') of JSON text: a string's text, any other value as "
                        "compact JSON; NULL where there is none.",
    "REGEXP_EXTRACT": "The first match of a java.util.regex pattern in the text, or the group given of it; NULL "
                      "without a match.",
    "REGEXP_EXTRACT_ALL": "Every match of a java.util.regex pattern in the text, or the group given of each, as an "
                          "ARRAY.",
    "REGEXP_REPLACE": "The text with every match of a java.util.regex pattern replaced ($1 and ${name} for groups).",
    "REGEXP_SPLIT_TO_ARRAY": "The parts of the text between the matches of a java.util.regex pattern, as an ARRAY.",
    # ---- numbers
    "ABS": "The absolute value, of the argument's type.",
    "ROUND": "The number rounded half away from zero to the given decimal places (0 by default; negative "
             "rounds to tens, hundreds, ...).",
    "FLOOR": "The largest whole number not above the number.",
    "CEIL": "The smallest whole number not below the number.",
    "GEO_DISTANCE": "The great-circle distance between two points given as latitude and longitude in degrees "
                    "(haversine formula), in kilometres, or in miles with 'mi'; NULL for a latitude beyond "
                    "+-90 or a longitude beyond +-180.",
    "SQRT": "The square root, a DOUBLE.",
    "CBRT": "The cube root, a DOUBLE.",
    "EXP": "e raised to the number, a DOUBLE.",
    "LN": "The natural logarithm, a DOUBLE; NULL for 0 or less.",
    "POWER": "The first number raised to the second, a DOUBLE.",
    "SIGN": "-1.0, 0.0 or 1.0 as the number is negative, zero or positive, a DOUBLE.",
    "SIN": "The sine of an angle in radians, a DOUBLE.",
    "COS": "The cosine of an angle in radians, a DOUBLE.",
    "TAN": "The tangent of an angle in radians, a DOUBLE.",
    "COT": "The cotangent of an angle in radians, a DOUBLE.",
    "ASIN": "The arc sine in radians, a DOUBLE.",
    "ACOS": "The arc cosine in radians, a DOUBLE.",
    "ATAN": "The arc tangent in radians, a DOUBLE.",
    "ATAN2": "The angle in radians of the point (x, y) given as ATAN2(y, x), a DOUBLE.",
    "SINH": "The hyperbolic sine, a DOUBLE.",
    "COSH": "The hyperbolic cosine, a DOUBLE.",
    "TANH": "The hyperbolic tangent, a DOUBLE.",
    "DEGREES": "The angle in radians as degrees, a DOUBLE.",
    "RADIANS": "The angle in degrees as radians, a DOUBLE.",
    "PI": "The number pi, a DOUBLE.",
    "GREATEST": "The greatest of the values, NULLs left out.",
    "LEAST": "The least of the values, NULLs left out.",
    # ---- NULLs
    "COALESCE": "The first of the values that is not NULL.",
    "IFNULL": "The first value, or the second where the first is NULL.",
    "NULLIF": "NULL where the two values are equal, else the first.",
    "RANDOM": "A random DOUBLE from 0 (included) to 1 (excluded), a new one each call.",
    # ---- collections
    "ARRAY_LENGTH": "The number of items of the ARRAY.",
    "ARRAY_CONTAINS": "Whether the ARRAY has the value among its items.",
    "ARRAY_REMOVE": "The ARRAY without the items equal to the value.",
    "ARRAY_DISTINCT": "The ARRAY's items without repeats, in the order first seen.",
    "ARRAY_SORT": "The ARRAY's items sorted, 'ASC' (the default) or 'DESC', NULLs last either way.",
    "ARRAY_MAX": "The greatest item of the ARRAY, NULLs left out.",
    "ARRAY_MIN": "The least item of the ARRAY, NULLs left out.",
    "ARRAY_JOIN": "The ARRAY's items as text joined by the delimiter (',' by default), a NULL item as 'null'.",
    "ARRAY_CONCAT": "The items of the first ARRAY, then the second's; a NULL ARRAY counts as none.",
    "ARRAY_UNION": "The distinct items of either ARRAY, in the order first seen.",
    "ARRAY_INTERSECT": "The distinct items of the first ARRAY that the second has, in the order first seen.",
    "ARRAY_EXCEPT": "The distinct items of the first ARRAY that the second lacks, in the order first seen.",
    "MAP_KEYS": "The MAP's keys, as an ARRAY.",
    "MAP_UNION": "The entries of both MAPs, the second's value where both have a key; a NULL MAP counts as none.",
    "MAP_VALUES": "The MAP's values, as an ARRAY.",
    "ENTRIES": "The MAP's entries as an ARRAY of STRUCTs of K and V, sorted by key when the second argument is true.",
    "AS_MAP": "A MAP of each key of the first ARRAY to the value at its place in the second.",
    "GENERATE_SERIES": "The whole numbers from the start to the end, both included, by the step (1 or -1 towards "
                       "the end by default), as an ARRAY.",
    # ---- times
    "TIMESTAMPTOSTRING": "Epoch milliseconds as text in a java.time pattern, in UTC or the zone given.",
    "STRINGTOTIMESTAMP": "Text in a java.time pattern as epoch milliseconds, read in UTC or the zone given.",
    "CONVERT_TZ": "A TIMESTAMP read as the wall time of one time zone, as another zone's wall clock shows that "
                  "moment.",
    "FORMAT_TIMESTAMP": "A TIMESTAMP as text in a java.time pattern, in UTC or the zone given.",
    "PARSE_TIMESTAMP": "Text in a java.time pattern as a TIMESTAMP, read in UTC or the zone given.",
    "FROM_UNIXTIME": "Epoch milliseconds as a TIMESTAMP.",
    "UNIX_TIMESTAMP": "A TIMESTAMP's epoch milliseconds; without an argument now's (a persistent query's batch's time).",
    "TIMESTAMPADD": "The TIMESTAMP moved forward by a number of MILLISECONDS, SECONDS, MINUTES, HOURS or DAYS.",
    "TIMESTAMPSUB": "The TIMESTAMP moved back by a number of MILLISECONDS, SECONDS, MINUTES, HOURS or DAYS.",
    "FORMAT_DATE": "A DATE as text in a java.time pattern.",
    "PARSE_DATE": "Text in a java.time pattern as a DATE.",
    "DATEADD": "The DATE moved forward by a number of DAYS.",
    "DATESUB": "The DATE moved back by a number of DAYS.",
    "FROM_DAYS": "Days from the epoch (1970-01-01) as a DATE.",
    "DATETOSTRING": "Days from the epoch written with a Java date pattern (ksqlDB's older form of FORMAT_DATE).",
    "STRINGTODATE": "Text read with a Java date pattern, as days from the epoch (ksqlDB's older form of PARSE_DATE).",
    "UNIX_DATE": "A DATE's days from the epoch (1970-01-01); without an argument today's, in UTC.",
    # ---- aggregates
    "COUNT": "The number of rows (COUNT(*)) or of values that are not NULL, per group.",
    "SUM": "The sum of the values, per group.",
    "AVG": "The average of the values, a DOUBLE, per group.",
    "MIN": "The least value, per group.",
    "MAX": "The greatest value, per group.",
    "COUNT_DISTINCT": "The number of distinct values that are not NULL, per group.",
    "STDDEV_SAMP": "The sample standard deviation of the values, a DOUBLE, per group.",
    "CORRELATION": "CORRELATION(x, y): the Pearson correlation coefficient of the pairs of x and y that hold two "
                   "values, a DOUBLE, per group; NaN below two pairs or when either column holds one value only.",
    "COLLECT_LIST": "The values in the order read, as an ARRAY, per group.",
    "ATTR": "The group's one value, or NULL when its rows hold several (ksqlDB's: for a column expected to be the "
            "same in every row of a group).",
    "COLLECT_SET": "The distinct values in the order first read, as an ARRAY, per group.",
    "HISTOGRAM": "How many times each text occurs, as a MAP, per group.",
    "EARLIEST_BY_OFFSET": "The value of the group's first record, or of its first n, by offset (NULLs left out "
                          "unless asked).",
    "LATEST_BY_OFFSET": "The value of the group's last record, or of its last n, by offset (NULLs left out unless "
                        "asked).",
    "TOPK": "The k greatest values, greatest first, NULLs left out, as an ARRAY, per group.",
    "TOPKDISTINCT": "The k greatest distinct values, greatest first, as an ARRAY, per group.",
    # ---- table functions
    "CUBE_EXPLODE": "A row of each combination of the ARRAY's items, each item there or NULL (2^N rows, a NULL item's "
                    "combinations once; none for a NULL ARRAY; at most 20 items), as an ARRAY, the other columns "
                    "repeated.",
    "EXPLODE": "A row of each item of the ARRAY (none for an empty or NULL one), the other columns repeated; "
               "several EXPLODEs are zipped, the shorter ones NULL past their end.",
    # ---- lambdas
    "TRANSFORM": "Each item of an ARRAY, or each key and value of a MAP, as the lambda makes it.",
    "FILTER": "The items of an ARRAY, or the entries of a MAP, for which the lambda gives true.",
    "REDUCE": "The state left by the lambda applied to the initial state and each item (or key and value) in turn.",
}
"""Each function's overview, by name."""
